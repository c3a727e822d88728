"""App specs, loading, input mapping and the `serve` command, without a server."""

from __future__ import annotations

import pytest
from pydantic import BaseModel

from teola.cli import main
from teola.server.app_loading import AppSpec, load_apps, wrap_app
from teola.server.apps import is_app
from teola.server.errors import APIError
from teola.server.framework_apps import LangChainApp
from teola.server.inputs import to_app_input


def test_app_spec_names() -> None:
    assert AppSpec.parse("pkg.mod:chain") == AppSpec("chain", "pkg.mod", "chain")
    assert AppSpec.parse("qa=pkg.mod:holder.chain") == AppSpec("qa", "pkg.mod", "holder.chain")
    with pytest.raises(ValueError, match="module:attr"):
        AppSpec.parse("no_colon")


def test_load_apps_wraps_runnables_and_rejects_duplicates() -> None:
    (app,) = load_apps(["server_fakes:chain"])
    assert isinstance(app, LangChainApp) and is_app(app) and app.name == "chain"
    assert app.runnable.invoke({"question": "hi"}) == app.runnable.original.invoke({"question": "hi"})
    app.runnable.close()
    with pytest.raises(ValueError, match="two apps are named"):
        load_apps(["server_fakes:chain", "server_fakes:chain"])
    with pytest.raises(ValueError, match="no attribute"):
        load_apps(["server_fakes:missing"])


def test_telling_an_app_from_a_runnable_reads_no_property() -> None:
    """A runnable whose `input_schema` raises (a LangGraph graph with a `typing.TypedDict`
    state on Python 3.11 does) is still served: recognising an `App` must not read it."""
    from langchain_core.runnables import RunnableLambda

    class Unreadable(RunnableLambda):
        @property
        def input_schema(self) -> type[BaseModel]:
            raise RuntimeError("building the input schema failed")

    runnable = Unreadable(lambda question: question.upper())
    assert not is_app(runnable)
    app = wrap_app("shout", runnable)
    assert isinstance(app, LangChainApp)
    app.runnable.close()


class Two(BaseModel):
    context: str
    question: str


class One(BaseModel):
    question: str


def test_input_mapping() -> None:
    assert to_app_input(None, "text", "prompt", "m") == "text"
    assert to_app_input(One, "text", "prompt", "m") == {"question": "text"}
    assert to_app_input(Two, '{"context": "c", "question": "q"}', "prompt", "m") == {"context": "c", "question": "q"}
    with pytest.raises(APIError, match="takes the variables context, question") as info:
        to_app_input(Two, "plain", "messages.2.content", "m")
    assert info.value.status == 400 and info.value.param == "messages.2.content"
    with pytest.raises(APIError, match="context") as info:
        to_app_input(Two, '{"question": "q"}', "prompt", "m")
    assert info.value.param == "prompt:context"


def test_serve_command_is_registered(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--help"])
    assert info.value.code == 0
    assert "--api-key" in capsys.readouterr().out
