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
from collections.abc import Collection

from teola_core.ir.prompt import PromptTemplate, Segment

_FIELD = re.compile(r"\{([^{}]+)\}")  # llama_index.core.prompts.utils.SafeFormatter.format


def segments_of(template: str, keys: Collection[str]) -> PromptTemplate | None:
    """The template's segments given the keys it is formatted with; None if a key is no port name."""
    if not all(key.isidentifier() for key in keys):
        return None
    segments: list[Segment] = []
    literal, pos = "", 0
    for match in _FIELD.finditer(template):
        literal += template[pos : match.start()]
        key = match.group(1)
        if key in keys:
            if literal:
                segments.append(Segment(text=literal))
            literal = ""
            segments.append(Segment(var=key))
        else:
            literal += match.group(0)
        pos = match.end()
    literal += template[pos:]
    if literal:
        segments.append(Segment(text=literal))
    return PromptTemplate(tuple(segments))
