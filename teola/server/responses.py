"""From the app's output to OpenAI response text, and token usage.

Text: a string as is; a LangChain message (or chunk) by its `.text`; anything else as
JSON. Usage: a message's `usage_metadata` when the app's last model reports it; else
tokens are counted by whitespace (`len(text.split())`) on the input text and the answer
text — an estimate, documented as such, since Teola does not know the app's tokenizer.
"""

from __future__ import annotations

import json
from typing import Any

from teola.server.schemas import Usage


def text_of(value: Any) -> str | None:
    """The text of a string or message-like output; None when it is not text."""
    if isinstance(value, str):
        return value
    text = getattr(value, "text", None)
    if isinstance(text, str) and hasattr(value, "content"):
        return text
    return None


def to_text(output: Any) -> str:
    """The response text of a whole output."""
    text = text_of(output)
    if text is not None:
        return text
    return json.dumps(output, default=_json_default, ensure_ascii=False)


def _json_default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)
    return dump() if callable(dump) else str(value)


def count_tokens(text: str) -> int:
    """A whitespace token count (an estimate: the app's tokenizer is unknown)."""
    return len(text.split())


def usage_of(output: Any, prompt: str, answer: str) -> Usage:
    meta = getattr(output, "usage_metadata", None)
    if isinstance(meta, dict) and "input_tokens" in meta and "output_tokens" in meta:
        prompt_tokens, completion_tokens = int(meta["input_tokens"]), int(meta["output_tokens"])
    else:
        prompt_tokens, completion_tokens = count_tokens(prompt), count_tokens(answer)
    return Usage(
        prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, total_tokens=prompt_tokens + completion_tokens
    )


def add_chunks(final: Any, chunk: Any, started: bool) -> Any:
    """Chunks added up as LangChain adds them (`+`, else the last one wins)."""
    if not started:
        return chunk
    try:
        return final + chunk
    except TypeError:
        return chunk


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """The text before the first stop string (OpenAI's `stop`, not included), and whether one was met."""
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


class StopCutter:
    """`stop` on a stream: hands text on as it comes, holding back only what could be the
    start of a stop string, and nothing after the first stop string.

        cut = StopCutter(["END"])
        cut.feed("abcE") + cut.feed("ND more") + cut.close()   # "abc"
    """

    def __init__(self, stops: list[str]) -> None:
        self.stops = stops
        self.stopped = False
        self._held = ""
        self._keep = max((len(s) for s in stops), default=1) - 1

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        text, self.stopped = cut_at_stop(self._held + piece, self.stops)
        if self.stopped:
            self._held = ""
            return text
        split = max(0, len(text) - self._keep)
        text, self._held = text[:split], text[split:]
        return text

    def close(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held
