"""Shared pieces of the benchmark workloads: prompts, context blocks, the fake model.

The text is synthetic but shaped like the paper's datasets: chunks of about a hundred
tokens (words), short questions, short answers. Everything is a deterministic function
of the query's index, so every system in a run sees the same inputs. The corpus' chunks
and questions come from `teola_adapters.simulated.text` (the examples use them too).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from teola_adapters.simulated.text import corpus_words
from teola_core.ir.types import Document, Scored

EXPAND_MARKER = "Write {n} search queries, one per line, for the question below."
CONTEXT_MARKER = "Situate the chunk below within the whole document in one short sentence."
ANSWER_INSTRUCTION = (
    "You are a careful assistant. Answer the question using only the context passages. "
    "Cite the passages you use and keep the answer short and precise. "
)


def docs_to_context(docs: Sequence[Any]) -> str:
    """Render retrieved documents (or scored documents) as the prompt's context block."""
    texts = [d.doc.text if isinstance(d, Scored) else d.text for d in docs]
    return "\n".join(f"[{i + 1}] {t}" for i, t in enumerate(texts))


def flatten_unique(hits: list[list[Document]]) -> list[Document]:
    """Merge several queries' hits, first occurrence wins (order kept)."""
    seen: set[str] = set()
    merged: list[Document] = []
    for per_query in hits:
        for doc in per_query:
            if doc.id not in seen:
                seen.add(doc.id)
                merged.append(doc)
    return merged


def single(question: str) -> list[str]:
    return [question]


def first_hits(hits: list[list[Document]]) -> list[Document]:
    return hits[0]


@dataclass(frozen=True)
class FakeModel:
    """The simulated LLM's text: a deterministic function of the prompt.

    It follows the workloads' instructions: `n` lines for a query-expansion prompt, one
    short sentence for a chunk-context prompt, an answer of `answer_tokens` words
    otherwise. The simulated engine charges time by the tokens of what this returns.
    """

    answer_tokens: int = 48
    query_tokens: int = 12
    context_tokens: int = 24

    def __call__(self, prompt: str, max_tokens: int) -> str:
        if prompt.startswith(EXPAND_MARKER.split("{n}")[0]):
            n = int(prompt.split()[1])
            lines = [" ".join(corpus_words(f"{prompt}/{i}", self.query_tokens)) for i in range(n)]
            return "\n".join(lines)
        if prompt.startswith(CONTEXT_MARKER):
            return " ".join(corpus_words(prompt, min(self.context_tokens, max_tokens)))
        return " ".join(corpus_words(prompt, min(self.answer_tokens, max_tokens)))
