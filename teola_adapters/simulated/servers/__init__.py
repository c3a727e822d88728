"""Simulated OpenAI-compatible servers (vLLM, an embedding and a rerank server) over the simulated engines.

    from teola_adapters.simulated.servers import SimServers
    with SimServers(time_scale=0.5) as servers:
        llm = ChatOpenAI(base_url=servers.base_url, api_key="x", temperature=0)

Needs fastapi and uvicorn (`teola[bench]`). Modules: `app` (the app and its thread),
`completions`, `retrieval` (the endpoints), `backend` (the engines), `batcher`,
`responder` (what the model writes).
"""

from teola_adapters.simulated.servers.app import SimServers, make_app
from teola_adapters.simulated.servers.backend import SimBackend
from teola_adapters.simulated.servers.batcher import BATCHING_MODES, Batcher, Batching
from teola_adapters.simulated.servers.responder import ExampleResponder, messages_to_prompt

__all__ = [
    "BATCHING_MODES",
    "Batcher",
    "Batching",
    "ExampleResponder",
    "SimBackend",
    "SimServers",
    "make_app",
    "messages_to_prompt",
]
