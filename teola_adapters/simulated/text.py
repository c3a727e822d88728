"""The simulated model's text (tokenizer, stream pieces, default writer) and the synthetic corpus.

tokens_of("Say hi")                 # ["Say", "hi"]: whitespace-separated words
"".join(token_pieces(text)) == text # one piece per token, whitespace kept
pseudo_words("Say hi", 8)           # 8 deterministic pseudo-words
corpus_words("doc-3/0", 100)        # 100 words of the synthetic corpus' vocabulary
make_chunks("kb", 64, 60)           # 64 chunks of 60 such words; make_question("q-1"): a question
"""

from __future__ import annotations

import hashlib
import random
import re

from teola_adapters.simulated.clock import stable_hash

_PIECE = re.compile(r"\s*\S+")
_SYLLABLES = ("ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "da", "po", "gu")


def tokens_of(text: str) -> list[str]:
    """The simulated tokenizer: whitespace-separated words."""
    return text.split()


def token_pieces(text: str) -> list[str]:
    """One piece per token, each with the whitespace before it: `"".join(pieces) == text`.

    Trailing whitespace rides on the last piece. Streaming yields these pieces, so the
    deltas keep the text's newlines (line-split items work) and concatenate exactly.
    """
    pieces = _PIECE.findall(text)
    tail = text[sum(map(len, pieces)) :]
    if tail:
        if pieces:
            pieces[-1] += tail
        else:
            pieces = [tail]
    return pieces


def pseudo_words(prompt: str, max_tokens: int) -> str:
    """The default responder: `max_tokens` pseudo-words, a deterministic function of the prompt."""
    rng = random.Random(stable_hash("responder", prompt))
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(max_tokens))


# The synthetic corpus' words: text shaped like documents, queries and answers.
_VOCABULARY = tuple(
    [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "energy",
        "river",
        "market",
        "policy",
        "network",
        "signal",
        "model",
        "memory",
        "vector",
        "index",
        "graph",
        "engine",
        "query",
        "answer",
        "token",
        "prompt",
        "cache",
        "batch",
        "latency",
        "stage",
        "search",
        "rank",
        "scale",
        "cloud",
        "storage",
        "compute",
        "budget",
        "region",
        "planet",
        "ocean",
        "forest",
        "climate",
        "music",
        "history",
        "science",
        "language",
        "theory",
        "method",
        "result",
        "value",
        "system",
        "design",
        "protocol",
        "server",
        "client",
        "kernel",
        "thread",
        "process",
    ]
)


def corpus_words(seed: str, n: int) -> list[str]:
    """n words of the synthetic corpus, a deterministic function of `seed`."""
    rng = random.Random(hashlib.sha256(seed.encode()).digest())
    return [rng.choice(_VOCABULARY) for _ in range(n)]


def make_chunks(doc_id: str, n_chunks: int, tokens_per_chunk: int) -> list[str]:
    """A synthetic document: `n_chunks` chunks of `tokens_per_chunk` corpus words each."""
    return [" ".join(corpus_words(f"{doc_id}/{i}", tokens_per_chunk)) for i in range(n_chunks)]


def make_question(doc_id: str, tokens: int = 14) -> str:
    """A synthetic question about `doc_id`: `tokens` corpus words and a question mark."""
    return " ".join(corpus_words(f"{doc_id}/question", tokens)) + " ?"
