"""LlamaIndex prompt templates as Teola segment templates, with LlamaIndex's own rules.

`PromptTemplate.format` renders with `SafeFormatter`: every `{key}` (regex
`\\{([^{}]+)\\}`) whose key was given is replaced by `str(value)`; any other brace text
stays as written (`{{` is *not* an escape). `segments_of` cuts the template at exactly
those places, so `teola_core.ir.prompt.PromptTemplate.render` gives the same string and
prefill split sees which prefix is literal or ready early.

    >>> segments_of("Q: {q} {{raw}}", {"q"}).render({"q": "why"})
    'Q: why {{raw}}'
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from typing import Any

from llama_index.core.llms.llm import default_completion_to_prompt
from llama_index.core.prompts.base import PromptTemplate as LIPromptTemplate
from llama_index.core.prompts.base import SelectorPromptTemplate

from teola_core.ir.prompt import PromptTemplate, Segment

_FIELD = re.compile(r"\{([^{}]+)\}")  # llama_index.core.prompts.utils.SafeFormatter.format


def segments_of(template: str, keys: Collection[str]) -> PromptTemplate | None:
    """The template's segments given the keys it is formatted with; None if a key is no port name."""
    segments = segments_with(template, keys, {})
    return None if segments is None else PromptTemplate(tuple(segments))


def segments_with(template: str, variables: Collection[str], constants: Mapping[str, Any]) -> list[Segment] | None:
    """`SafeFormatter` over `template` with `variables` left as segments and `constants` filled in.

    A field whose key is in `variables` becomes a variable segment, one in `constants`
    the literal `str(value)`, any other field stays as written. None if a variable name
    is no port name.
    """
    if not all(key.isidentifier() for key in variables):
        return None
    segments: list[Segment] = []
    literal, pos = "", 0
    for match in _FIELD.finditer(template):
        literal += template[pos : match.start()]
        key = match.group(1)
        if key in variables:
            if literal:
                segments.append(Segment(text=literal))
            literal = ""
            segments.append(Segment(var=key))
        elif key in constants:
            literal += str(constants[key])
        else:
            literal += match.group(0)
        pos = match.end()
    literal += template[pos:]
    if literal:
        segments.append(Segment(text=literal))
    return segments


def _plain(template: Any) -> bool:
    """A `PromptTemplate` whose `format` is `SafeFormatter` over its kwargs and nothing else."""
    return (
        type(template) is LIPromptTemplate
        and template.output_parser is None
        and not template.template_var_mappings
        and not template.function_mappings
    )


def predict_template(template: Any, llm: Any, variables: Collection[str]) -> PromptTemplate | None:
    """The segments of the prompt `llm.predict(template, **values)` sends to `complete`.

    That prompt is `llm._get_prompt(template, **values)`: the template chosen for the
    LLM (a `SelectorPromptTemplate` picks by the LLM, e.g. chat or not), formatted with
    its partial kwargs, the call's values and the LLM's `messages_to_prompt` (`str` of
    each, `SafeFormatter`), then `completion_to_prompt` (must be LlamaIndex's identity
    default), the LLM's output parser's `format` (must be none), and `_extend_prompt`:
    `system_prompt + "\\n\\n"` before it, then `query_wrapper_prompt` around it. `variables`
    (the per-call values) stay variables; everything else is a literal. None where any
    step is not one of these plain forms. Callers still compare the rendering with
    `llm._get_prompt` at run time, so a case missed here costs only the optimization.
    E.g. `predict_template(PromptTemplate("Q: {query_str} C: {context_str}"), llm,
    {"query_str", "context_str"})` for a plain completion LLM is those four segments.
    """
    if isinstance(template, SelectorPromptTemplate):
        template = template.select(llm=llm)
    if not _plain(template) or getattr(llm, "output_parser", None) is not None:
        return None
    if llm.completion_to_prompt not in (None, default_completion_to_prompt):
        return None
    constants = {**template.kwargs, "messages_to_prompt": llm.messages_to_prompt}
    for v in variables:
        constants.pop(v, None)
    body = segments_with(template.template, variables, constants)
    if body is None:
        return None
    if llm.system_prompt:
        body = [Segment(text=llm.system_prompt + "\n\n"), *body]
    wrapper = llm.query_wrapper_prompt
    if wrapper:
        if not _plain(wrapper):
            return None
        outer = segments_with(
            wrapper.template, {"query_str"}, {k: v for k, v in wrapper.kwargs.items() if k != "query_str"}
        )
        if outer is None:
            return None
        body = [inner for seg in outer for inner in (body if seg.var == "query_str" else [seg])]
    return PromptTemplate(tuple(_joined(body)))


def _joined(segments: list[Segment]) -> list[Segment]:
    """Adjacent literal segments as one."""
    out: list[Segment] = []
    for seg in segments:
        if seg.var is None and out and out[-1].var is None:
            out[-1] = Segment(text=out[-1].text + seg.text)
        elif seg.var is not None or seg.text:
            out.append(seg)
    return out
