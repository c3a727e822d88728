"""A call as a vLLM request: the prompt dict, the sampling settings from the node's config
and the prefix-cache salt (its priority: `teola_adapters.server_priority.call_priority`).

Unset sampling fields take the model's generation-config defaults, as vLLM's OpenAI server
does (a request's own value, else the model's default, else vLLM's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from teola_adapters._llm import stop_list

# Sampling fields the node config may set, and those the model's generation config may default.
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty")
_SAMPLING += ("repetition_penalty",)
_MODEL_DEFAULTS = ("repetition_penalty", "presence_penalty", "frequency_penalty", "top_p", "top_k", "min_p")


def model_sampling_defaults(model_config: Any) -> dict[str, Any]:
    """The sampling fields the model's generation config sets (vLLM's `get_diff_sampling_param`)."""
    defaults = getattr(model_config, "get_diff_sampling_param", dict)()
    return {k: defaults[k] for k in _MODEL_DEFAULTS if k in defaults}


def sampling_settings(config: Mapping[str, Any], model_defaults: Mapping[str, Any]) -> dict[str, Any]:
    """`SamplingParams` fields of a decode node (greedy unless it sets `temperature`), but `max_tokens`."""
    sampling: dict[str, Any] = dict(model_defaults)
    sampling.update({k: config[k] for k in _SAMPLING if k in config})
    sampling["temperature"] = float(config.get("temperature", 0.0))
    stops = stop_list(config)
    if stops:
        sampling["stop"] = stops
    return sampling


def vllm_prompt(prompt: str | list[int], salt: str | None) -> dict[str, Any]:
    """vLLM's prompt dict: text or token ids, and the prefix-cache salt if any."""
    out: dict[str, Any] = {"prompt": prompt} if isinstance(prompt, str) else {"prompt_token_ids": prompt}
    if salt is not None:
        out["cache_salt"] = salt
    return out


def cache_salt(config: Mapping[str, Any]) -> str | None:
    salt = config.get("cache_salt")
    return None if salt is None else str(salt)
