"""What the simulated model behind the servers writes, and how it reads a chat request.

ExampleResponder()("Write 3 search queries, one per line ...", 64)   # 3 lines of words
messages_to_prompt([{"role": "user", "content": "hi"}])               # "<|user|>\nhi\n<|assistant|>\n"
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from teola_adapters.simulated.text import corpus_words

_QUERIES = re.compile(
    r"(?:Write|Generate|generate) (\d+) (?:\w+\s+)*?"
    r"(?:(?:search\s+)?queries,\s+one\s+(?:per|on\s+each)\s+line|versions\s+of\s+the\s+given\s+user\s+question)"
)
_LENGTH = re.compile(r"in about (\d+) words")


@dataclass(frozen=True)
class ExampleResponder:
    """What the simulated model writes: a deterministic function of the prompt.

    It follows the examples' instructions: "Write N ... queries, one per line" (and the
    query-generation prompts of LlamaIndex's `QueryFusionRetriever`, "Generate N search
    queries, one on each line", and LangChain's `MultiQueryRetriever`, "generate N
    different versions of the given user question") gives N lines of `query_tokens`
    words; "in about N words" gives N words; anything else `answer_tokens` words. Words
    come from the synthetic corpus' vocabulary, so generated queries retrieve something.
    """

    answer_tokens: int = 48
    query_tokens: int = 10

    def __call__(self, prompt: str, max_tokens: int) -> str:
        m = _QUERIES.search(prompt)
        if m is not None:
            n = int(m.group(1))
            return "\n".join(" ".join(corpus_words(f"{prompt}/{i}", self.query_tokens)) for i in range(n))
        m = _LENGTH.search(prompt)
        n = int(m.group(1)) if m is not None else self.answer_tokens
        return " ".join(corpus_words(prompt, min(n, max_tokens)))


def messages_to_prompt(
    messages: Sequence[dict[str, Any]], *, add_generation_prompt: bool = True, continue_final_message: bool = False
) -> str:
    """The prompt text the simulated model sees for a chat request (role-tagged lines): its chat template.

    A chat request renders with the generation prompt (the open assistant turn). As vLLM's
    template options: `continue_final_message` leaves the last message open (nothing after
    its text), so the text is a prefix of any conversation that continues that message.
    """
    parts = []
    for m in messages:
        content = m.get("content") or ""
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"<|{m.get('role', 'user')}|>\n{content}")
    text = "\n".join(parts)
    if continue_final_message:
        return text
    return text + ("\n<|assistant|>\n" if add_generation_prompt else "\n")
