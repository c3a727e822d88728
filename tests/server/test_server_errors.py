"""Errors in OpenAI's format with the right status; malformed input never stops the server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from server_support import API_KEY, Served

AUTH = {"Authorization": f"Bearer {API_KEY}"}
GOOD = {"model": "chain", "messages": [{"role": "user", "content": "still there?"}]}


def post(served: Served, path: str, content: bytes, headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(
        f"{served.url}{path}", content=content, headers={**AUTH, "Content-Type": "application/json", **(headers or {})}
    )


def as_json(body: Any) -> bytes:
    return json.dumps(body).encode()


MALFORMED: list[tuple[str, str, bytes, int, str | None]] = [
    ("invalid json", "/v1/chat/completions", b'{"model": "chain", "messages": [', 400, None),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400, None),
    ("empty body", "/v1/chat/completions", b"", 400, None),
    ("model wrong type", "/v1/chat/completions", as_json({**GOOD, "model": 5}), 400, "model"),
    ("messages a string", "/v1/chat/completions", as_json({**GOOD, "messages": "hi"}), 400, "messages"),
    ("messages empty", "/v1/chat/completions", as_json({**GOOD, "messages": []}), 400, "messages"),
    (
        "content wrong type",
        "/v1/chat/completions",
        as_json({**GOOD, "messages": [{"role": "user", "content": 7}]}),
        400,
        "messages.0.content",
    ),
    (
        "bad role",
        "/v1/chat/completions",
        as_json({**GOOD, "messages": [{"role": "wizard", "content": "x"}]}),
        400,
        "messages.0.role",
    ),
    ("unknown field", "/v1/chat/completions", as_json({**GOOD, "frobnicate": True}), 400, "frobnicate"),
    ("stream wrong type", "/v1/chat/completions", as_json({**GOOD, "stream": "yes please"}), 400, "stream"),
    ("n > 1", "/v1/chat/completions", as_json({**GOOD, "n": 3}), 400, "n"),
    (
        "no user message",
        "/v1/chat/completions",
        as_json({**GOOD, "messages": [{"role": "system", "content": "x"}]}),
        400,
        "messages",
    ),
    ("prompt missing", "/v1/completions", as_json({"model": "chain"}), 400, "prompt"),
    ("two prompts", "/v1/completions", as_json({"model": "chain", "prompt": ["a", "b"]}), 400, "prompt"),
    ("huge body", "/v1/chat/completions", as_json({**GOOD, "user": "x" * (2 << 20)}), 413, None),
    (
        "several variables, not JSON",
        "/v1/chat/completions",
        as_json({"model": "multi", "messages": [{"role": "user", "content": "just text"}]}),
        400,
        "messages.0.content",
    ),
    (
        "several variables, one missing",
        "/v1/completions",
        as_json({"model": "multi", "prompt": json.dumps({"question": "q"})}),
        400,
        "prompt:context",
    ),
    (
        "several variables, wrong type",
        "/v1/completions",
        as_json({"model": "multi", "prompt": json.dumps({"question": "q", "context": 3})}),
        400,
        "prompt:context",
    ),
]


@pytest.mark.parametrize(
    ("path", "content", "status", "param"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_gives_4xx_naming_the_field(
    served: Served, path: str, content: bytes, status: int, param: str | None
) -> None:
    response = post(served, path, content)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param, error
    assert post(served, "/v1/chat/completions", as_json(GOOD)).status_code == 200  # still serving


def test_huge_chunked_body_is_413(served: Served) -> None:
    """No Content-Length (chunked): the limit is enforced while reading."""

    def parts() -> Iterator[bytes]:
        yield b'{"model": "chain", "user": "'
        for _ in range(4):
            yield b"x" * (512 << 10)
        yield b'", "messages": [{"role": "user", "content": "x"}]}'

    headers = {**AUTH, "Content-Type": "application/json"}
    response = httpx.post(f"{served.url}/v1/chat/completions", content=parts(), headers=headers)
    assert response.status_code == 413 and response.json()["error"]["code"] == "body_too_large"
    assert post(served, "/v1/chat/completions", as_json(GOOD)).status_code == 200


def test_missing_and_wrong_api_key_401(served: Served) -> None:
    for key in ("wrong", ""):
        client = openai.OpenAI(base_url=f"{served.url}/v1", api_key=key or "unused", max_retries=0)
        headers = {"Authorization": ""} if not key else None
        with pytest.raises(openai.AuthenticationError) as info:
            client.with_options(default_headers=headers or {}).chat.completions.create(
                model="chain", messages=[{"role": "user", "content": "x"}]
            )
        assert info.value.status_code == 401
    assert httpx.get(f"{served.url}/v1/models").status_code == 401
    assert httpx.get(f"{served.url}/health").status_code == 200  # health and metrics need no key


def test_unknown_model_404(served: Served) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        served.openai().chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    body: Any = info.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model" and "chain" in body["message"]
    with pytest.raises(openai.NotFoundError):
        served.openai().models.retrieve("nope")


def test_unknown_route_404_in_openai_format(served: Served) -> None:
    response = httpx.get(f"{served.url}/v1/nothing", headers=AUTH)
    assert response.status_code == 404 and "error" in response.json()


@pytest.mark.parametrize("stream", [False, True])
def test_app_failure_500_names_the_step(served: Served, stream: bool) -> None:
    with pytest.raises(openai.InternalServerError) as info:
        served.openai().chat.completions.create(
            model="failing", messages=[{"role": "user", "content": "boom"}], stream=stream
        )
    message = info.value.body["message"]  # type: ignore[index]
    assert "ValueError" in message and "exploded" in message and "explode" in message.split("(", 1)[1]
    assert served.openai().chat.completions.create(**GOOD).choices[0].message.content  # still serving
