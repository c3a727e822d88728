"""Response synthesizers: a prefix warm-up beside the original call, or (decompose) the LLM call.

    if (prefix := warmup_prefix(engines, synthesizer)) is not None:   # the LLM's server warms
        warm = trace_warmup(b, engines, synthesizer, prefix, query_str)

By default a synthesizer runs as its own `synthesize` / `asynthesize` (its spans, events
and callbacks are its own); where its LLM's engine warms a vLLM prefix cache, the answer
prompt's ready prefix (the text before the nodes, the question included when it comes
first) is warmed while retrieval runs. With `decompose=True` the exact classes
"compact", "refine" and "simple_summarize" become plan + FORMAT + LLM whenever one LLM
call answers (`trace_synthesis`). The reasoning: docs/llamaindex.md ("Synthesizers").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from llama_index.core.llms.structured_llm import StructuredLLM
from llama_index.core.response_synthesizers import CompactAndRefine, Refine, SimpleSummarize
from llama_index.core.schema import MetadataMode

from teola_core.ir.builder import GraphBuilder, Value
from teola_core.ir.kinds import MergeMode, PortSpec, PrimitiveKind
from teola_core.ir.prompt import PromptTemplate
from teola_core.ir.types import PortType
from teola_llamaindex.formatting import predict_template
from teola_llamaindex.prefix_warmup import why_no_warmup
from teola_llamaindex.registry import EngineRegistry

_CLASSES = (Refine, CompactAndRefine, SimpleSummarize)
_OPAQUE: dict[str, Any] = {"single": False, "context": None, "prompt": None}


def why_opaque(synthesizer: Any) -> str | None:
    """Why the synthesizer runs as one call (see the module docstring), or None."""
    cls = type(synthesizer)
    if cls not in _CLASSES:
        return f"{cls.__name__} is not decomposed"
    if synthesizer._streaming:
        return "streaming"
    llm = synthesizer._llm
    if isinstance(llm, StructuredLLM) or getattr(llm, "output_parser", None) is not None:
        return "a structured LLM or an LLM output parser"
    if getattr(synthesizer, "_output_cls", None) is not None:
        return "output_cls"
    if cls is not SimpleSummarize:
        if synthesizer._structured_answer_filtering:
            return "structured answer filtering"
        factory = synthesizer._program_factory
        if (
            getattr(factory, "__func__", None) is not Refine._default_program_factory
            or factory.__self__ is not synthesizer
        ):
            return "a custom program factory"
    return None


def warmup_prefix(engines: EngineRegistry, synthesizer: Any) -> PromptTemplate | None:
    """The answer prompt's ready prefix, where the synthesizer's LLM engine warms a server; else None.

    The prefix is the QA template as `llm.predict` renders it, up to its first variable
    other than `query_str` (so up to the nodes' text). Only for the exact one-prompt
    classes with a completion model whose server warms (`prefix_warmup.why_no_warmup`).
    """
    if type(synthesizer) not in _CLASSES or not engines.warm_prefix or why_no_warmup(synthesizer._llm) is not None:
        return None
    template = predict_template(synthesizer._text_qa_template, synthesizer._llm, ("query_str", "context_str"))
    if template is None:
        return None
    prefix = []
    for segment in template.segments:
        if segment.var not in (None, "query_str"):
            break
        prefix.append(segment)
    return PromptTemplate(tuple(prefix)) if prefix else None


def trace_warmup(
    b: GraphBuilder, engines: EngineRegistry, synthesizer: Any, prefix: PromptTemplate, query_str: Value
) -> Value:
    """The PARTIAL_PREFILL that warms `prefix` (from `warmup_prefix`) on the synthesizer's LLM engine."""
    rendered = b.format(prefix, **{v: query_str for v in prefix.variables})
    engine = engines.llm(synthesizer._llm)
    node = b.add(PrimitiveKind.PARTIAL_PREFILL, {"prefix": rendered}, engine=engine, name="llm.warm_prefix")
    return Value(node.id, "kv")


def max_tokens_hint(llm: Any) -> int:
    """A planning hint only (results never depend on it): the LLM's declared output length."""
    num_output = getattr(llm.metadata, "num_output", -1)
    return num_output if isinstance(num_output, int) and num_output > 0 else 256


def trace_synthesis(
    b: GraphBuilder,
    engines: EngineRegistry,
    synthesizer: Any,
    query_str: Value,
    nodes: Value,
    original: Callable[[], Value],
) -> Value:
    """The Response of `synthesizer` for `query_str` and `nodes` (see the module docstring).

    `original()` adds, inside the opaque branch, the call that runs the synthesizer as is
    (it must return the Response's Value). Call only when `why_opaque` is None.
    """
    llm = synthesizer._llm
    chat = bool(llm.metadata.is_chat_model)
    template = None if chat else predict_template(synthesizer._text_qa_template, llm, ("query_str", "context_str"))
    planned = b.call(
        _plan(synthesizer, chat), {"nodes": nodes, "query_str": query_str}, outputs=("single", "context", "prompt")
    )
    engine = engines.llm(llm)
    prompt = b.call_outputs(planned, "prompt")
    if template is not None:
        prompt = b.format(template, query_str=query_str, context_str=b.call_outputs(planned, "context"))
        expected = b.call_outputs(planned, "prompt")
        check = b.call(
            _same_prompt, {"single": planned, "rendered": prompt, "expected": expected}, name="check", inline=True
        )
    else:
        check = b.call(_single, {"single": planned}, name="check", inline=True)
    choose = b.add(
        PrimitiveKind.CONDITION,
        {"value": check},
        config={"predicate": _index, "branches": 2, "inline": True},
        name="choose",
    )
    branch = Value(choose.id, "branch")
    api = "chat" if chat else "predict"

    def decode_and_finish(prefill: Any) -> Value:
        decode = b.add(
            PrimitiveKind.DECODE,
            {"kv": Value(prefill.id, "kv")},
            engine=engine,
            config={"max_tokens": max_tokens_hint(llm), "api": api},
            output_ports=(PortSpec("text", PortType.TEXT),),
            name="llm.decode",
        )
        return b.call(
            _finish(synthesizer), {"text": Value(decode.id, "text"), "nodes": nodes}, name="response", inline=True
        )

    if template is not None:  # the prefill outside the branch: a split prefill may start early
        prefill = b.add(PrimitiveKind.PREFILL, {"prompt": prompt}, engine=engine, name="llm.prefill")
        with b.branch(branch, 0):
            single = decode_and_finish(prefill)
    else:
        with b.branch(branch, 0):
            single = decode_and_finish(
                b.add(PrimitiveKind.PREFILL, {"prompt": prompt}, engine=engine, name="llm.prefill")
            )
    with b.branch(branch, 1):
        whole = original()
    return b.aggregate([single, whole], MergeMode.SELECT)


def _plan(synthesizer: Any, chat: bool) -> Callable[..., dict[str, Any]]:
    """One LLM call or not, its context and its prompt, as the synthesizer computes them."""
    llm = synthesizer._llm

    def plan(nodes: list[Any], query_str: str) -> dict[str, Any]:
        # checked again per query: the user may have changed the synthesizer since tracing
        if len(nodes) == 0 or why_opaque(synthesizer) is not None or bool(llm.metadata.is_chat_model) != chat:
            return _OPAQUE
        texts = [n.node.get_content(metadata_mode=MetadataMode.LLM) for n in nodes]
        template = synthesizer._text_qa_template.partial_format(query_str=query_str)
        helper = synthesizer._prompt_helper
        context: Any
        if type(synthesizer) is SimpleSummarize:
            context = helper.truncate(prompt=template, text_chunks=["\n".join(texts)], llm=llm)
        else:
            if type(synthesizer) is CompactAndRefine:
                texts = synthesizer._make_compact_text_chunks(query_str, texts)
            if len(texts) != 1:
                return _OPAQUE
            pieces = helper.repack(template, [texts[0]], llm=llm)
            if len(pieces) != 1:
                return _OPAQUE
            context = pieces[0]
        prompt = (
            llm._get_messages(template, context_str=context) if chat else llm._get_prompt(template, context_str=context)
        )
        return {"single": True, "context": context, "prompt": prompt}

    return plan


def _same_prompt(single: bool, rendered: str, expected: Any) -> bool:
    return single and rendered == expected


def _single(single: bool) -> bool:
    return single


def _index(one_call: bool) -> int:
    return 0 if one_call else 1


def _finish(synthesizer: Any) -> Callable[..., Any]:
    """`answer or "Empty Response"` as the Response `synthesize` returns."""

    def finish(text: str, nodes: list[Any]) -> Any:
        return synthesizer._prepare_response_output(text or "Empty Response", list(nodes))

    return finish
