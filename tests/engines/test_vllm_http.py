"""The vLLM HTTP engine against a mocked server (respx), and a refused connection for real.

The mock server tokenizes one token per character (so a prefix's tokens are a prefix of
the prompt's), answers completions with a text derived from the prompt, streams it as
server-sent events, and fails on demand: HTTP 500, a timeout, malformed SSE.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

pytest.importorskip("openai")
pytest.importorskip("tenacity")
pytest.importorskip("httpx")
pytest.importorskip("respx")

import httpx
import respx
from engine_testkit import node, run

from teola_adapters.vllm_http import VLLMHTTPEngine, VLLMHTTPError
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.split_units import Lines
from teola_core.ir.types import KVHandle

K = PrimitiveKind
SERVER = "http://vllm.test"


def answer(prompt: str) -> str:
    return f"first line for {len(prompt)}\nsecond line\nthird"


class FakeVLLM:
    """Routes for /tokenize and /v1/completions; records what it was sent."""

    def __init__(self, mock: respx.MockRouter) -> None:
        self.completions: list[dict] = []
        self.fail: dict[str, int] = {}  # marker in the prompt -> how many times to fail with 500
        mock.post(f"{SERVER}/tokenize").mock(side_effect=self.tokenize)
        mock.post(f"{SERVER}/v1/completions").mock(side_effect=self.complete)

    def tokenize(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        tokens = [ord(c) for c in body["prompt"]]
        return httpx.Response(200, json={"tokens": tokens, "count": len(tokens), "max_model_len": 2048})

    def complete(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.completions.append(body)
        prompt = body["prompt"]
        text_prompt = prompt if isinstance(prompt, str) else "".join(map(chr, prompt))
        for marker, left in self.fail.items():
            if marker in text_prompt and left > 0:
                self.fail[marker] = left - 1
                return httpx.Response(500, json={"error": {"message": "engine died"}})
        if "TIMEOUT" in text_prompt:
            raise httpx.ReadTimeout("the server took too long", request=request)
        text = answer(text_prompt)[: 4 * body["max_tokens"]]
        if body.get("stream"):
            if "BADSSE" in text_prompt:
                return httpx.Response(
                    200, content=b"data: {not json\n\n", headers={"content-type": "text/event-stream"}
                )
            events = [_chunk(piece) for piece in _pieces(text)] + [b"data: [DONE]\n\n"]
            return httpx.Response(200, content=b"".join(events), headers={"content-type": "text/event-stream"})
        if "BADJSON" in text_prompt:
            return httpx.Response(200, content=b"{oops", headers={"content-type": "application/json"})
        return httpx.Response(200, json=_completion(text))


def _pieces(text: str) -> list[str]:
    return [text[i : i + 5] for i in range(0, len(text), 5)]


def _completion(text: str) -> dict:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "smol",
        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}],
    }


def _chunk(text: str) -> bytes:
    body = _completion(text)
    body["choices"][0]["finish_reason"] = None
    return f"data: {json.dumps(body)}\n\n".encode()


@pytest.fixture
def server():
    with respx.mock(assert_all_called=False) as mock:
        yield FakeVLLM(mock)


def make_engine(**kwargs) -> VLLMHTTPEngine:
    options = {"retries": 1, "retry_wait_s": 0.001, "http_client": httpx.AsyncClient()}
    return VLLMHTTPEngine(SERVER + "/v1", "smol", **(options | kwargs))


def kv(prompt: str) -> KVHandle:
    return KVHandle("llm", prompt)


def test_partial_prefill_warms_whole_blocks_of_token_ids(server) -> None:
    engine = make_engine()
    prefix = "x" * 40  # 40 tokens: two whole blocks of 16 (the last token is held back)
    (out,) = run(engine.run([Call("q", node(K.PARTIAL_PREFILL, "llm"), {"prefix": prefix})]))
    (warm,) = server.completions
    assert warm["prompt"] == [ord("x")] * 32 and warm["max_tokens"] == 1 and warm["temperature"] == 0
    assert out["kv"].token == tuple([ord("x")] * 32) and engine.stats.warm_tokens == 32
    # A prefix shorter than one block (plus the held-back token) sends nothing.
    run(engine.run([Call("q", node(K.PARTIAL_PREFILL, "llm"), {"prefix": "y" * 16})]))
    assert len(server.completions) == 1


def test_prefill_is_lazy_and_decode_sends_the_prompt_with_node_sampling(server) -> None:
    engine = make_engine()
    prompt = "Tell me three things."

    async def main():
        (handle,) = await engine.run([Call("q", node(K.PREFILL, "llm"), {"prompt": prompt})])
        assert server.completions == []  # nothing sent for a prefill
        decode = node(K.DECODE, "llm", max_tokens=20, split_unit=Lines(), top_k=5, seed=3, stop=["\n\n"])
        return await engine.run_one(Call("q", decode, {"kv": handle["kv"]}))

    out = run(main())
    (sent,) = server.completions
    assert sent["prompt"] == prompt and sent["max_tokens"] == 20 and sent["temperature"] == 0.0
    assert sent["top_k"] == 5 and sent["seed"] == 3 and sent["stop"] == ["\n\n"]
    assert out["text"] == answer(prompt)[:80] and out["items"] == Lines().parse(out["text"])


def test_stream_yields_the_server_deltas(server) -> None:
    engine = make_engine()
    decode = node(K.DECODE, "llm", max_tokens=20)

    async def main() -> list[str]:
        return [d async for d in engine.stream(Call("q", decode, {"kv": kv("Hello")}))]

    deltas = run(main())
    assert len(deltas) > 3 and "".join(deltas) == answer("Hello")[:80]
    assert server.completions[0]["stream"] is True


def test_transient_errors_are_retried(server) -> None:
    engine = make_engine(retries=2)
    server.fail["FLAKY"] = 2
    out = run(engine.run_one(Call("q", node(K.DECODE, "llm", max_tokens=5), {"kv": kv("FLAKY prompt")})))
    assert out["text"] and engine.stats.retries == 2 and len(server.completions) == 3


@pytest.mark.parametrize(
    ("marker", "kind", "expected"),
    [
        ("FAIL500", K.DECODE, "InternalServerError"),
        ("TIMEOUT", K.DECODE, "APITimeoutError"),
        ("BADJSON", K.DECODE, "decode failed"),
        ("BADSSE", "stream", "JSONDecodeError"),
        ("FAIL500", "stream", "InternalServerError"),
    ],
)
def test_a_failing_call_names_primitive_and_server_and_spares_the_others(server, marker, kind, expected) -> None:
    engine = make_engine(retries=1)
    server.fail["FAIL500"] = 100
    decode = node(K.DECODE, "llm", node_id="answer.decode", max_tokens=5)

    async def main():
        if kind == "stream":

            async def consume() -> str:
                return "".join([d async for d in engine.stream(Call("bad", decode, {"kv": kv(marker)}))])

            good, bad = await asyncio.gather(
                engine.run_one(Call("good", decode, {"kv": kv("fine")})), consume(), return_exceptions=True
            )
            return good, bad
        return await engine.run([Call("good", decode, {"kv": kv("fine")}), Call("bad", decode, {"kv": kv(marker)})])

    good, bad = run(main())
    assert good["text"] == answer("fine")[:20]
    assert isinstance(bad, VLLMHTTPError)
    message = str(bad)
    assert "answer.decode" in message and "decode" in message and SERVER in message and expected in message


def test_a_refused_connection_fails_with_the_server_named() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    engine = VLLMHTTPEngine(f"http://127.0.0.1:{port}", "smol", retries=1, retry_wait_s=0.001, timeout_s=5)
    calls = [
        Call("a", node(K.DECODE, "llm", node_id="gen.decode", max_tokens=3), {"kv": kv("hi")}),
        Call("b", node(K.PARTIAL_PREFILL, "llm", node_id="gen.warm"), {"prefix": "a long enough prefix"}),
        Call("c", node(K.PREFILL, "llm"), {"prompt": "lazy: needs no server"}),
    ]
    decode, warm, lazy = run(engine.run(calls))
    for error, primitive in ((decode, "gen.decode"), (warm, "gen.warm")):
        assert isinstance(error, VLLMHTTPError)
        assert primitive in str(error) and f"127.0.0.1:{port}" in str(error) and "APIConnectionError" in str(error)
    assert isinstance(lazy["kv"], KVHandle)
    assert engine.stats.retries == 2


def test_malformed_inputs_fail_alone(server) -> None:
    engine = make_engine()
    calls = [
        Call("a", node(K.DECODE, "llm", max_tokens=2), {"kv": KVHandle("another-engine", "x")}),
        Call("b", node(K.PREFILL, "llm"), {"prompt": 7}),
        Call("c", node(K.DECODE, "llm", max_tokens=2), {"kv": kv("ok")}),
    ]
    foreign, not_text, ok = run(engine.run(calls))
    assert isinstance(foreign, ValueError) and isinstance(not_text, TypeError) and ok["text"]
