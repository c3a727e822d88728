"""One decode's generation: token choice, stop strings, `max_tokens` and streamed deltas.

    gen = Generation(tokens, max_tokens=64, stops=["\\n"], sampler=None, emit=print)
    while gen.advance(llm):       # after each step put the new logits in gen.logits
        ...
    text = gen.finish()

Streamed deltas hold back text that may start a stop string, so they add up to the text.
Generation stops exactly at `max_tokens`, even inside a multi-byte character (dropped).
"""

from __future__ import annotations

import codecs
from collections.abc import Callable, Sequence
from typing import Any

from teola_adapters.llamacpp.lowlevel import BatchedLlama, Sampler

Tokens = tuple[int, ...]


class Generation:
    """A decode's text so far, from the logits after its prompt on (greedy unless a sampler is given)."""

    def __init__(
        self,
        tokens: Tokens,
        *,
        max_tokens: int,
        stops: list[str],
        sampler: Sampler | None,
        emit: Callable[[str], None] | None = None,
    ) -> None:
        self.tokens = tokens  # the prompt
        self.max_tokens = max_tokens
        self.stops = stops
        self.sampler = sampler
        self.emit = emit
        self.logits: Any = None  # after the last evaluated token
        self.pos = len(tokens)  # the next token's position
        self.token = -1  # the token to evaluate next
        self.generated = 0
        self.text = ""
        self.emitted = 0
        self.stopped = False
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="ignore")

    def advance(self, llm: BatchedLlama) -> bool:
        """Choose the next token and take its text; False when the generation is done."""
        token = self.sampler.sample(self.logits) if self.sampler is not None else llm.argmax(self.logits)
        if llm.is_eog(token):
            return False
        self.generated += 1
        self.text += self._utf8.decode(llm.detokenize([token]))
        cut = first_stop(self.text, self.stops)
        if cut is not None:
            self.text, self.stopped = self.text[:cut], True
        self._emit(len(self.text) if self.stopped else len(self.text) - stop_prefix_len(self.text, self.stops))
        if self.stopped or self.generated >= self.max_tokens:
            return False
        self.token = token
        return True

    def finish(self) -> str:
        """The whole text (the rest is streamed); frees the sampler."""
        if not self.stopped:
            self.text += self._utf8.decode(b"", final=True)
        self._emit(len(self.text))
        self.close()
        return self.text

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()
            self.sampler = None

    def _emit(self, safe: int) -> None:
        if self.emit is not None and safe > self.emitted:
            self.emit(self.text[self.emitted : safe])
            self.emitted = safe


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    hits = [text.index(s) for s in stops if s and s in text]
    return min(hits) if hits else None


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """The longest end of `text` that a stop string starts with (text that may yet be cut)."""
    longest = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:n]):
                longest = n
                break
    return longest
