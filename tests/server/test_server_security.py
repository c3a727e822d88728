"""Security and input: the key guards /metrics, JSON bodies only, strict types, every OpenAI
field honoured or refused by name, streamed errors name the step, bad app specs and open
listening addresses are said in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from server_fakes import build_apps
from server_support import API_KEY, AUTH, Served

from teola.cli import main
from teola.server import BackgroundServer, create_app, wrap_app
from teola.server.runner import exposure_warning, is_loopback
from teola.server.schemas import UNSUPPORTED

HEADERS = {**AUTH, "Content-Type": "application/json"}
GOOD = {"model": "chain", "messages": [{"role": "user", "content": "still there?"}]}
HERE = Path(__file__).parent


def post(served: Served, body: object, headers: dict[str, str] | None = None, path: str = "/v1/chat/completions"):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{served.url}{path}", content=content, headers=headers if headers is not None else HEADERS)


def test_metrics_need_the_key_unless_made_public(served: Served) -> None:
    assert httpx.get(f"{served.url}/metrics").status_code == 401
    assert httpx.get(f"{served.url}/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert "teola_requests_total" in httpx.get(f"{served.url}/metrics", headers=AUTH).text
    assert httpx.get(f"{served.url}/health").json() == {"status": "ok"}  # names no model
    apps = [wrap_app("chain", build_apps()["apps"]["chain"])]
    with BackgroundServer(create_app(apps, api_key=API_KEY, public_metrics=True)) as url:
        assert httpx.get(f"{url}/metrics").status_code == 200
        assert httpx.get(f"{url}/v1/models").status_code == 401  # the rest stays guarded


@pytest.mark.parametrize(
    "content_type",
    [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/jsonp"],
)
def test_a_body_that_is_not_declared_json_is_415(served: Served, content_type: str | None) -> None:
    headers = dict(AUTH) if content_type is None else {**AUTH, "Content-Type": content_type}
    response = post(served, GOOD, headers=headers)
    assert response.status_code == 415, response.text
    assert "Content-Type must be application/json" in response.json()["error"]["message"]
    assert post(served, GOOD, headers={**AUTH, "Content-Type": "application/json; charset=utf-8"}).status_code == 200


@pytest.mark.parametrize(("field", "value"), [("stream", "yes"), ("stream", 1), ("model", 5), ("n", "1")])
def test_types_are_strict(served: Served, field: str, value: object) -> None:
    response = post(served, {**GOOD, field: value})
    assert response.status_code == 400 and response.json()["error"]["param"] == field, response.text


@pytest.mark.parametrize("field", sorted(UNSUPPORTED))
def test_an_openai_field_the_app_cannot_honour_is_refused_by_name(served: Served, field: str) -> None:
    response = post(served, {**GOOD, field: 1})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == field and "not supported by a served Teola app" in error["message"]
    assert post(served, {**GOOD, field: None}).status_code == 200  # null means absent


def test_message_fields_the_app_never_sees_are_refused(served: Served) -> None:
    body = {**GOOD, "messages": [{"role": "user", "content": "x", "name": "bob"}]}
    response = post(served, body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "messages.0.name"
    for store, status in ((True, 400), (False, 200)):
        assert post(served, {**GOOD, "store": store}).status_code == status


def test_stop_is_honoured_in_answers_and_streams(served: Served) -> None:
    question = {"question": "where do stop strings cut"}
    full = served.apps["chain"].invoke(question)
    stop = " said"
    expected = full[: full.index(stop)]
    client = served.openai()
    messages = [{"role": "user", "content": question["question"]}]
    answer = client.chat.completions.create(model="chain", messages=messages, stop=[stop, "never there"])
    assert answer.choices[0].message.content == expected
    streamed = client.chat.completions.create(model="chain", messages=messages, stop=stop, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == expected


def test_echo_is_honoured_for_completions(served: Served) -> None:
    prompt = "echo me"
    answer = served.apps["chain"].invoke({"question": prompt})
    client = served.openai()
    assert client.completions.create(model="chain", prompt=prompt, echo=True).choices[0].text == prompt + answer
    streamed = client.completions.create(model="chain", prompt=prompt, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == prompt + answer


def test_an_error_in_the_middle_of_a_stream_names_the_step(served: Served) -> None:
    stream = served.openai().chat.completions.create(
        model="midway", messages=[{"role": "user", "content": "go"}], stream=True
    )
    seen = ""
    with pytest.raises(openai.APIError) as info:
        for chunk in stream:
            seen += (chunk.choices[0].delta.content or "") if chunk.choices else ""
    assert seen  # the failure came after the first chunks
    assert "broke after two chunks" in info.value.message and "in step 'explode_midway'" in info.value.message


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("nonexistent:app", "no module named 'nonexistent' (hint: run teola serve in the folder that holds"),
        ("server_fakes:missing", "server_fakes has no attribute 'missing' (it has: "),
        ("server_fakes:not_an_app", "app 'not_an_app' is a int: expected a LangChain Runnable"),
        ("no_colon", "expected module:attr or name=module:attr (e.g. myapp:chain"),
        (
            "raises_on_import:app",
            "importing 'raises_on_import' failed: RuntimeError: broken on purpose (hint: python -c",
        ),
    ],
)
def test_a_bad_app_spec_fails_in_one_line_with_a_hint(spec: str, says: str, tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(HERE))
    with pytest.raises(SystemExit) as info:
        main(["serve", spec])
    message = str(info.value.code)
    assert message.startswith("teola serve: ") and says in message and "\n" not in message, message


def test_the_command_prints_one_line_and_no_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "teola.cli", "serve", "nonexistent:app"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "Traceback" not in done.stderr, done.stderr


def test_listening_beyond_loopback_without_a_key_is_warned_loudly() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.7")
    assert exposure_warning("127.0.0.1", None) is None and exposure_warning("0.0.0.0", "key") is None
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("TEOLA_API_KEY", None)
    server = subprocess.Popen(
        [sys.executable, "-m", "teola.cli", "serve", "server_fakes:chain", "--host", "0.0.0.0", "--port", "0"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert server.stderr is not None
        lines = []
        for line in server.stderr:  # until uvicorn says it is up; the warning comes before
            lines.append(line)
            if "Uvicorn running" in line or "Application startup complete" in line:
                break
        text = "".join(lines)
        assert "NO API KEY" in text and "'0.0.0.0'" in text and "--api-key" in text, text
    finally:
        server.terminate()
        server.wait(30)
