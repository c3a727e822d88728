"""Measure a pgvector store's profile: `ingest` over rows, `search` over query vectors.

Runs against the store's own database in a scratch collection (deleted afterwards):
ingest(n) is one INGEST of n fresh 384-dimension rows (one transaction); search(n) is one
SEARCH of n query vectors (top 4) in a collection of `collection_rows` rows.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path

from teola_adapters.pgvector.engine import PgVectorStore
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.node import Node, kind_node
from teola_core.profiles.profile import LatencyProfile
from teola_core.profiles.profiler import profile_engine


def _node(kind: PrimitiveKind, engine: str, **config: object) -> Node:
    return kind_node(f"profile.{kind.value}", kind, engine, config)


async def measure_profile(
    store: PgVectorStore,
    batch_sizes: Sequence[int] = (1, 4, 16, 64, 256),
    repeats: int = 3,
    dim: int = 384,
    collection_rows: int = 1000,
    save_to: str | Path | None = None,
) -> LatencyProfile:
    """Measure both curves, install the profile on the store and return it."""
    np = store._np
    rng = np.random.default_rng(0)
    scratch = f"teola-profile-{uuid.uuid4().hex[:8]}"
    counter = iter(range(10**9))

    def vectors(n: int) -> list[list[float]]:
        m = rng.standard_normal((n, dim)).astype("float32")
        return (m / np.linalg.norm(m, axis=1, keepdims=True)).tolist()

    ingest = _node(PrimitiveKind.INGEST, store.name, collection=scratch)
    search = _node(PrimitiveKind.SEARCH, store.name, top_k=4)

    def ingest_calls(n: int) -> list[Call]:
        run = next(counter)
        texts = [f"profile row {run}-{i}" for i in range(n)]
        return [Call("profile", ingest, {"texts": texts, "vectors": vectors(n)})]

    try:
        profile = await profile_engine(store, ingest_calls, "ingest", batch_sizes, repeats, into=store.profile)
        have = len(store.collection(scratch))
        if have < collection_rows:
            await store.run_one(ingest_calls(collection_rows - have)[0])
        profile = await profile_engine(
            store,
            lambda n: [Call("profile", search, {"vectors": vectors(n), "index": scratch})],
            "search",
            batch_sizes,
            repeats,
            into=profile,
            save_to=save_to,
        )
    finally:
        store.drop_collection(scratch)
    store.profile = profile
    return profile
