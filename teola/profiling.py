"""`teola profile ENGINE`: measure a real engine on this machine and write its profile.

The profile (latency across batch sizes, or tokens and sequences for an LLM) is what
the passes and the engine schedulers plan with: pass the file back as the engine's
`profile=` argument (e.g. `LlamaCppEngine(profile="teola-profiles/llamacpp.json")`).
The engines ship profiles measured on a 2-core CPU machine; measure your own hardware.

    teola profile embeddings --out teola-profiles/embeddings.json
    teola profile vllm --url http://127.0.0.1:8000 --model my-model
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from teola.cli_support import add_command, bounded_int, working
from teola_core.engines.protocol import Engine

E = TypeVar("E", bound=Engine)

ENGINES = ("llamacpp", "embeddings", "rerank", "pgvector", "vllm")


def add_profile_command(commands: Any) -> None:
    p = add_command(commands, "profile", "measure a real engine's latency profile on this machine", __doc__)
    p.add_argument("engine", choices=ENGINES, help="the engine to measure")
    p.add_argument("--out", type=Path, default=None, help="where to write it (default: teola-profiles/ENGINE.json)")
    p.add_argument("--repeats", type=bounded_int(1), default=3, help="measurements per point (the median is kept)")
    p.add_argument("--url", default=None, help="vllm: the server's base URL (required for vllm)")
    p.add_argument("--model", default=None, help="vllm: the served model name (required for vllm)")
    p.set_defaults(handler=run_profile)


def run_profile(args: argparse.Namespace) -> int:
    out: Path = args.out or Path("teola-profiles") / f"{args.engine}.json"
    if args.engine == "vllm" and not (args.url and args.model):
        raise SystemExit(
            "teola profile vllm: --url and --model are required "
            "(hint: teola profile vllm --url http://127.0.0.1:8000 --model my-model)"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    with working(f"measuring {args.engine} on this machine ({args.repeats} repeats a point)"):
        profile = asyncio.run(_measure(args.engine, args.repeats, out, args.url, args.model))
    for op, curve in profile.curves.items():
        points = ", ".join(f"{x:g}: {s * 1000:.1f} ms" for x, s in curve.points)
        print(f"{args.engine} {op}: {points} (max efficient batch {curve.max_efficient()})")
    print(f"wrote {out}: pass it as the engine's profile= argument")
    return 0


async def _measure(engine: str, repeats: int, out: Path, url: str | None, model: str | None) -> Any:
    if engine == "llamacpp":
        from teola_adapters.llamacpp import LlamaCppEngine, measure_profile

        async with _closing(LlamaCppEngine()) as llm:
            return await measure_profile(llm, repeats=repeats, save_to=out)
    if engine in ("embeddings", "rerank"):
        from teola_adapters.embeddings import SentenceTransformerEmbedder
        from teola_adapters.embeddings import measure_profile as measure_embedder

        async with _closing(SentenceTransformerEmbedder()) as embedder:
            if engine == "embeddings":
                return await measure_embedder(embedder, repeats=repeats, save_to=out)
            from teola_adapters.rerank import make_reranker
            from teola_adapters.rerank import measure_profile as measure_reranker

            return await measure_reranker(make_reranker(embedder=embedder), repeats=repeats, save_to=out)
    if engine == "pgvector":
        from teola_adapters.pgvector import PgVectorStore
        from teola_adapters.pgvector import measure_profile as measure_store

        async with _closing(PgVectorStore()) as store:
            return await measure_store(store, repeats=repeats, save_to=out)
    from teola_adapters.vllm_http import VLLMHTTPEngine
    from teola_adapters.vllm_http import measure_profile as measure_vllm

    assert url is not None and model is not None
    async with _closing(VLLMHTTPEngine(url, model)) as vllm:
        return await measure_vllm(vllm, repeats=repeats, save_to=out)


@asynccontextmanager
async def _closing(engine: E) -> AsyncIterator[E]:
    """`engine` for the block, closed after it whatever happens: it holds a model, a server or a database."""
    try:
        yield engine
    finally:
        await engine.close()
