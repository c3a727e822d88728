"""`teola serve`: LangChain and LlamaIndex apps behind an OpenAI-compatible HTTP API.

    teola serve myapp:chain qa=myapp:rag_chain --port 8000 --api-key secret

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key="secret")
    client.chat.completions.create(model="chain", messages=[{"role": "user", "content": "..."}])

Input mapping: the last user message (chat) or the prompt (completions) becomes the
app's input: as is for an app taking one value, as `{var: text}` for an app taking one
variable, and as a JSON object (validated against the app's input schema; errors name
the field) for an app taking several. See `inputs`.

Modules: `apps` (the `App` seam), `framework_apps` (LangChain, LlamaIndex, LangGraph),
`failed_step` (the step an app failed in), `app_loading` (specs), `schemas` (request/response models),
`inputs`/`responses` (mapping), `routes`, `admission` (overload: bounded work, a bounded
wait, 503), `shedding` and `lag` (refusing before routing), `calls` (disconnect =
cancel), `streaming` (SSE), `metrics` (Prometheus), `errors` (OpenAI error format),
`options` (`ServeOptions`), `app` (FastAPI factory), `runner` (uvicorn, foreground or
background thread), `cli`.
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use, so `teola --help` works without the `serve` extra installed.
_EXPORTS = {
    "App": "teola.server.apps",
    "LangChainApp": "teola.server.framework_apps",
    "load_apps": "teola.server.app_loading",
    "wrap_app": "teola.server.app_loading",
    "create_app": "teola.server.app",
    "ServeOptions": "teola.server.options",
    "BackgroundServer": "teola.server.runner",
    "serve": "teola.server.runner",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'teola.server' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)
