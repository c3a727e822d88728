"""A model server's tokens per prompt character, learned from its own usage reports.

Teola sees a prompt's text; the server counts its tokens (its tokenizer and chat
template). Sizing a context against a KV cache needs the server's count before the
call, so each answer's reported prompt tokens teach the rate; before the first, 4
characters a token (English text on OpenAI-style tokenizers).

    rate = TokenRate()
    rate.observe(prompt_chars=4_000, prompt_tokens=500, answer_tokens=60)
    rate.prompt_tokens_of(8_000), rate.context_tokens(8_000)     # 1000, 1060
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

CHARS_PER_TOKEN = 4.0  # before the server's first usage report (English text, OpenAI-style tokenizers)


@dataclass
class TokenRate:
    """Tokens per prompt character and answer tokens per call, from the server's usage reports."""

    prompt_chars: int = 0
    prompt_tokens: int = 0
    prompts: int = 0  # usage reports that counted the prompt
    answers: int = 0
    answer_tokens: int = 0

    def observe(self, prompt_chars: int, prompt_tokens: int, answer_tokens: int) -> None:
        if prompt_chars > 0 and prompt_tokens > 0:
            self.prompt_chars += prompt_chars
            self.prompt_tokens += prompt_tokens
            self.prompts += 1
        self.answers += 1
        self.answer_tokens += max(0, answer_tokens)

    @property
    def mean_prompt_tokens(self) -> float | None:
        """A call's prompt, in the server's tokens, on average (None before a report)."""
        return self.prompt_tokens / self.prompts if self.prompts else None

    @property
    def mean_answer_tokens(self) -> float | None:
        """A call's answer, in tokens, on average (None before a report)."""
        return self.answer_tokens / self.answers if self.answers else None

    def prompt_tokens_of(self, prompt_chars: int) -> int:
        """A prompt of `prompt_chars` characters, in the server's tokens."""
        per_char = self.prompt_tokens / self.prompt_chars if self.prompt_chars else 1 / CHARS_PER_TOKEN
        return max(1, round(prompt_chars * per_char))

    def context_tokens(self, prompt_chars: int) -> int:
        """The KV a call with a prompt of `prompt_chars` characters takes, prompt and answer."""
        return round(self.prompt_tokens_of(prompt_chars) + (self.mean_answer_tokens or 0.0))


def openai_usage(usage: Any) -> tuple[int, int] | None:
    """Prompt and answer tokens from an OpenAI-style `usage` (an object or a dict with
    `prompt_tokens` and `completion_tokens`), if it reports a prompt."""
    if isinstance(usage, Mapping):
        prompt, answer = usage.get("prompt_tokens"), usage.get("completion_tokens")
    else:
        prompt, answer = getattr(usage, "prompt_tokens", None), getattr(usage, "completion_tokens", None)
    return (prompt, answer or 0) if isinstance(prompt, int) and prompt > 0 else None
