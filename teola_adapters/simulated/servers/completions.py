"""`POST /v1/chat/completions` and `POST /v1/completions` on the simulated LLM, with SSE streaming.

    app.add_api_route("/v1/chat/completions", chat, methods=["POST"])

Both read the `SimBackend` from `request.app.state.backend`; completions accept token-id
prompts (vLLM's API) when `app.state.vllm_api` is set. Streams end with `[DONE]`, after a
usage chunk when `stream_options.include_usage` asks for one.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from teola_adapters.simulated.servers.backend import ScriptedToolCall, SimBackend
from teola_adapters.simulated.servers.responder import messages_to_prompt
from teola_adapters.simulated.text import token_pieces, tokens_of


def usage(prompt: str, text: str) -> dict[str, int]:
    p, c = len(tokens_of(prompt)), len(token_pieces(text))
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}


def sse(payload: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def error(message: str, status: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def request_priority(b: SimBackend, body: dict[str, Any]) -> int:
    """vLLM's `priority` request field (lower runs first); ValueError names what is wrong."""
    if "priority" in body:
        b.requests["with_priority"] += 1
    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"priority must be an integer, got {priority!r}")
    b.llm_slots.check_priority(priority)
    return priority


def scripted_tool_calls(b: SimBackend, body: dict[str, Any], request_id: str) -> list[dict[str, Any]]:
    """The OpenAI `tool_calls` of a chat answer: the server's `chat_script` decides, for a
    request that offers tools; none otherwise."""
    if b.chat_script is None or not body.get("tools"):
        return []
    return tool_call_items(b.chat_script(body["messages"]) or [], request_id)


def tool_call_items(calls: Sequence[ScriptedToolCall], request_id: str) -> list[dict[str, Any]]:
    """Scripted tool calls as the items of an OpenAI chat answer's `tool_calls`."""
    items = []
    for i, call in enumerate(calls):
        function = {"name": call.name, "arguments": json.dumps(call.arguments)}
        items.append({"id": f"call-{request_id}-{i}", "type": "function", "function": function})
    return items


def _next_id(request: Request, prefix: str) -> tuple[str, int]:
    return f"{prefix}-{next(request.app.state.ids)}", int(time.time())


async def chat(request: Request) -> Any:
    body = await request.json()
    b: SimBackend = request.app.state.backend
    b.requests["chat"] += 1
    prompt = messages_to_prompt(body["messages"])
    try:
        priority = request_priority(b, body)
        b.check_fits(prompt)
    except ValueError as exc:
        return error(str(exc))
    model = body.get("model", "sim")
    value = body.get("max_completion_tokens") or body.get("max_tokens")
    max_tokens = int(value) if value else 256
    rid, created = _next_id(request, "chatcmpl")
    head = {"id": rid, "created": created, "model": model}
    tool_calls = scripted_tool_calls(b, body, rid)
    finish = "tool_calls" if tool_calls else "stop"
    if not body.get("stream"):
        text = await b.generate(prompt, max_tokens, priority)
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if tool_calls:
            message["tool_calls"] = tool_calls
        choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        return JSONResponse({**head, "object": "chat.completion", "choices": [choice], "usage": usage(prompt, text)})
    include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        return sse({**head, "object": "chat.completion.chunk", "choices": [choice]})

    async def events() -> AsyncIterator[bytes]:
        yield chunk({"role": "assistant", "content": ""}, None)
        text = ""
        async for piece in b.stream(prompt, max_tokens, priority):
            text += piece
            yield chunk({"content": piece}, None)
        if tool_calls:
            yield chunk({"tool_calls": [{"index": i, **call} for i, call in enumerate(tool_calls)]}, None)
        yield chunk({}, finish)
        if include_usage:
            yield sse({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage(prompt, text)})
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")


def completion_prompts(request: Request, prompt: Any) -> list[str] | None:
    """The prompts of a completions request: text, or (vLLM) token ids; None if malformed."""
    vllm_api: bool = request.app.state.vllm_api
    if isinstance(prompt, str):
        return [prompt]
    if vllm_api and isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        return None
    texts = []
    for p in prompt:
        if isinstance(p, str):
            texts.append(p)
        elif vllm_api and isinstance(p, list) and all(isinstance(t, int) for t in p):
            try:
                texts.append(request.app.state.backend.detokenize(p))
            except ValueError:
                return None
        else:
            return None
    return texts


async def completions(request: Request) -> Any:
    body = await request.json()
    b: SimBackend = request.app.state.backend
    b.requests["completions"] += 1
    prompts = completion_prompts(request, body["prompt"])
    if prompts is None:
        return error("prompts must be strings" + (" or token ids" if request.app.state.vllm_api else ""))
    try:
        priority = request_priority(b, body)
        for prompt in prompts:
            b.check_fits(prompt)
    except ValueError as exc:
        return error(str(exc))
    max_tokens = int(body.get("max_tokens") or 16)
    rid, created = _next_id(request, "cmpl")
    head = {"id": rid, "object": "text_completion", "created": created, "model": body.get("model", "sim")}
    if not body.get("stream"):
        texts = await asyncio.gather(*(b.generate(p, max_tokens, priority) for p in prompts))
        used = [usage(p, t) for p, t in zip(prompts, texts, strict=True)]
        choices = [{"index": i, "text": t, "finish_reason": "stop", "logprobs": None} for i, t in enumerate(texts)]
        return JSONResponse({**head, "choices": choices, "usage": {k: sum(u[k] for u in used) for k in used[0]}})
    if len(prompts) != 1:
        return error("streaming takes one prompt")

    def chunk(text: str, finish: str | None) -> bytes:
        return sse({**head, "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]})

    async def events() -> AsyncIterator[bytes]:
        async for piece in b.stream(prompts[0], max_tokens, priority):
            yield chunk(piece, None)
        yield chunk("", "stop")
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream")
