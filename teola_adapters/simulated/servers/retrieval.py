"""`POST /v1/embeddings`, `POST /v1/rerank` and vLLM's extras on the simulated engines.

    app.add_api_route("/v1/embeddings", embeddings, methods=["POST"])

Embeddings (float or base64) and rerank (Cohere/Jina shape) go through the backend's
`Batcher`s. vLLM's extras, for Teola's vLLM engine to warm the prefix cache here as on
vLLM: `/tokenize` (a `prompt`, or chat `messages` through the chat template), `/metrics`
(running and waiting requests, KV usage, the KV block size line) and `/reset_prefix_cache`.
"""

from __future__ import annotations

import base64
import math
import struct
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, PlainTextResponse

from teola_adapters.simulated.llm_state import LLMStats
from teola_adapters.simulated.prefix_cache import BLOCK_TOKENS
from teola_adapters.simulated.servers.backend import SimBackend
from teola_adapters.simulated.servers.completions import error
from teola_adapters.simulated.servers.responder import messages_to_prompt
from teola_adapters.simulated.text import tokens_of
from teola_core.scheduler.server_costs import PREFILL_COMPUTED, PREFILL_TIME, TOKEN_GAP_BOUNDS, TOKEN_GAPS


async def embeddings(request: Request) -> Any:
    body = await request.json()
    b: SimBackend = request.app.state.backend
    b.requests["embeddings"] += 1
    texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
    if not all(isinstance(t, str) for t in texts):
        return error("input must be strings (token ids unsupported)")
    vectors = await b.embed_batches.submit(texts, len(texts))
    b64 = body.get("encoding_format") == "base64"
    data = [
        {
            "object": "embedding",
            "index": i,
            "embedding": base64.b64encode(struct.pack(f"<{len(v)}f", *v)).decode() if b64 else v,
        }
        for i, v in enumerate(vectors)
    ]
    n = sum(len(tokens_of(t)) for t in texts)
    used = {"prompt_tokens": n, "total_tokens": n}
    return JSONResponse({"object": "list", "data": data, "model": body.get("model", "sim"), "usage": used})


async def rerank(request: Request) -> Any:
    body = await request.json()
    b: SimBackend = request.app.state.backend
    b.requests["rerank"] += 1
    query, docs = body["query"], list(body["documents"])
    scores = await b.rerank_batches.submit((query, docs), len(docs))
    order = sorted(range(len(docs)), key=lambda i: -scores[i])  # stable: ties keep input order
    top_n = body.get("top_n")
    results = [{"index": i, "relevance_score": scores[i]} for i in order[: top_n or len(order)]]
    return JSONResponse({"results": results, "model": body.get("model", "sim")})


async def tokenize(request: Request) -> Any:
    """vLLM's /tokenize: a `prompt`, or `messages` through the chat template."""
    body = await request.json()
    b: SimBackend = request.app.state.backend
    b.requests["tokenize"] += 1
    if "messages" in body:
        generation = bool(body.get("add_generation_prompt", True))
        continued = bool(body.get("continue_final_message", False))
        if generation and continued:
            return error("continue_final_message and add_generation_prompt cannot both be true")
        text = messages_to_prompt(body["messages"], add_generation_prompt=generation, continue_final_message=continued)
    elif isinstance(body.get("prompt"), str):
        text = body["prompt"]
    else:
        return error("give a `prompt` string or chat `messages`")
    tokens = b.token_ids(text)
    return JSONResponse({"count": len(tokens), "max_model_len": 32_768, "tokens": tokens})


async def metrics(request: Request) -> Any:
    """vLLM's Prometheus gauges of the LLM's load, the line that gives the KV block size, and
    the request histograms' sums that give what the LLM's work costs."""
    b: SimBackend = request.app.state.backend
    cache = b.llm.cache
    usage = cache.running_blocks / cache.capacity_blocks if cache is not None and cache.capacity_blocks else 0.0
    blocks = f',num_gpu_blocks="{cache.capacity_blocks}"' if cache is not None and b.kv_cache_tokens is not None else ""
    labels = 'model_name="sim"'
    # with a KV pool, a request waiting for room in it is waiting, as in vLLM
    for_room = b.llm.waiting_for_room() if b.kv_cache_tokens is not None else 0
    running, waiting = b.llm_slots.running_count - for_room, b.llm_slots.waiting_count + for_room
    lines = [
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {float(running)}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} {float(waiting)}",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{BLOCK_TOKENS}",enable_prefix_caching="True"{blocks}}} 1.0',
        *cost_histograms(b.llm.stats, labels),
    ]
    return PlainTextResponse("\n".join(lines) + "\n")


def cost_histograms(stats: LLMStats, labels: str) -> list[str]:
    """vLLM's request histograms that say what work costs (`ServerCosts`), in the model's
    simulated seconds: prefill time and computed tokens as sums and counts (one +Inf
    bucket), the gaps between tokens in vLLM's buckets."""
    lines = []
    for name, total in ((PREFILL_TIME, stats.prefill_s), (PREFILL_COMPUTED, stats.prefill_tokens)):
        lines += [
            f"# TYPE {name} histogram",
            f'{name}_bucket{{{labels},le="+Inf"}} {float(stats.prefills)}',
            f"{name}_sum{{{labels}}} {float(total)}",
            f"{name}_count{{{labels}}} {float(stats.prefills)}",
        ]
    lines.append(f"# TYPE {TOKEN_GAPS} histogram")
    cumulative = 0
    for bound in (*TOKEN_GAP_BOUNDS, math.inf):
        cumulative += stats.token_gaps[bound]
        le = "+Inf" if math.isinf(bound) else repr(bound)
        lines.append(f'{TOKEN_GAPS}_bucket{{{labels},le="{le}"}} {float(cumulative)}')
    lines += [
        f"{TOKEN_GAPS}_sum{{{labels}}} {stats.token_gap_s}",
        f"{TOKEN_GAPS}_count{{{labels}}} {float(cumulative)}",
    ]
    return lines


async def reset_prefix_cache(request: Request) -> Any:
    """Empty the LLM's prefix cache (as vLLM's endpoint of that name), between benchmark runs."""
    request.app.state.backend.reset_prefix_cache()
    return JSONResponse({"ok": True})
