"""The error a failed call raises, and the one-line summary of vLLM's own errors it carries."""

from __future__ import annotations


class VLLMLocalError(RuntimeError):
    """A call failed in the in-process vLLM engine; the message names the primitive and the engine."""


def brief(exc: BaseException) -> str:
    """`Type: first line` of an exception (vLLM wraps failures: name the cause too)."""
    text = str(exc).strip()
    summary = f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
    cause = exc.__cause__
    if cause is not None and cause is not exc and str(cause).strip():
        summary += f" (caused by {type(cause).__name__}: {str(cause).strip().splitlines()[0]})"
    return summary
