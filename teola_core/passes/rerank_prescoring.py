"""Rerank pre-scoring: score what a query ingests while its embeddings are computed.

A rerank whose candidates come from a search over an index the same query builds (a
document-QA app indexing the query's document) waits on the critical path for the
embeddings, the ingest and the search, and only then scores its candidates. Every
candidate such a search can return is one of the ingested texts, which are known from
the start: the reranker, idle meanwhile, can score them all beside the embedder, and the
rerank after the search becomes a lookup.

    embed(T) -> ingest -> search -> ... -> rerank(q, candidates)        becomes
    embed(T) -> ingest -> search -> ... -> candidates ─┐
    rerank(q, T as documents) = scores ────────────────┼-> rank (lookup, the rerank's id)
      unscored(candidates, scores) -> any? ─branch 1─> rerank(q, unscored) ┘ (optional)

Exact: a RERANK whose engine declares it splittable scores each (query, document text)
pair on its own (the contract its staged form, `MergeMode.TOPK`, relies on too), so the
lookup's scores are the ones the rerank would have computed (a reranker that normalises
over its list or ranks it as a whole declares itself not splittable, and is left alone),
and `rank` orders as the engine does: best first, ties in candidate order, cut to
`top_k`. A candidate with no score (not among the ingested texts) is scored by a
fallback RERANK, which a condition skips when there is none, so an unused fallback
never queues at the reranker.

Only where it pays, by the profiles (`estimates.finish_times`, one query alone): scoring
all |T| texts from when they are ready must fit `HEADROOM` times over before the
candidates are known (the embedding, ingest, the queries' own path and the search it
hides behind), on another engine and device than the texts' embedder (`EngineLimits.device`: a reranker
on the embedder's CPU or model would only take turns with it). No rerank profile: no
rewrite (it costs |T| / candidates times the rerank's work, so it is not done blind). A
rerank inside a branch is left alone (its pre-scoring would run whether or not the
branch is taken).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from functools import partial
from typing import Any

from teola_core.ir.graph import Graph, GraphEditor
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import ControlEdge, DataEdge, Node
from teola_core.ir.types import Document, PortType, Scored
from teola_core.passes.base import Pass, PassContext
from teola_core.passes.estimates import finish_times

ROLE = "prescoring"  # config key on the nodes this pass adds: they are never rewritten again
# The pre-scoring must fit this many times over before the candidates are known: the
# profiles time one query alone, and under load the reranker also serves other queries'
# pre-scorings (measured on advanced RAG at 0.5 q/s: a pre-scoring that fit once over
# lost 6 % of mean latency with the reranker 1.3x slower than profiled).
HEADROOM = 1.2


def as_documents(texts: Sequence[Any]) -> list[Document]:
    """The ingested texts as the documents the reranker scores (documents stay as they are)."""
    return [t if isinstance(t, Document) else Document(f"prescored/{i}", t) for i, t in enumerate(texts)]


def unscored(candidates: Sequence[Any], scored: Sequence[Scored]) -> list[Any]:
    """Candidates without a pre-computed score (anything not a Document goes to the
    fallback rerank too, which fails on it as the original rerank would)."""
    known = {s.doc.text for s in scored}
    return [d for d in candidates if not (isinstance(d, Document) and d.text in known)]


def any_unscored(missing: Sequence[Any]) -> int:
    """Branch 1 (run the fallback rerank) when some candidate has no score."""
    return 1 if missing else 0


def rank(
    candidates: Sequence[Document], scored: Sequence[Scored], top_k: int | None, rest: Sequence[Scored] = ()
) -> list[Scored]:
    """The rerank's result from known scores: best first, ties in candidate order."""
    score = {s.doc.text: s.score for s in scored}
    score.update((s.doc.text, s.score) for s in rest)
    ranked = sorted((Scored(d, score[d.text]) for d in candidates), key=lambda s: -s.score)
    return ranked if top_k is None else ranked[: int(top_k)]


class RerankPrescoring(Pass):
    name = "rerank-prescoring"

    def run(self, graph: Graph, ctx: PassContext) -> Graph:
        current = graph
        for node_id in graph.topological_order:
            node = current.nodes.get(node_id)
            if node is None or node.kind != PrimitiveKind.RERANK or ROLE in node.config:
                continue
            if not node.caps.splittable:  # its engine scores a list as a whole (softmax, listwise)
                continue
            found = _ingest_behind(current, node)
            if found is None or not _pays(current, node, found, ctx):
                continue
            current = _rewrite(current, node, found)
        return current


def _ingest_behind(graph: Graph, rerank: Node) -> Node | None:
    """The one INGEST whose index every search upstream of the rerank's candidates reads
    (at least one search), or None."""
    if any(e.branch is not None for e in graph.control_in(rerank.id)):
        return None
    docs = [e for e in graph.data_in(rerank.id) if e.dst_port == "docs"]
    if len(docs) != 1 or not any(e.dst_port == "query" for e in graph.data_in(rerank.id)):
        return None
    seen, todo, ingests, searches = {docs[0].src}, deque([docs[0].src]), set(), 0
    while todo:
        node = graph.nodes[todo.popleft()]
        if node.kind == PrimitiveKind.SEARCH:
            searches += 1
            ingests |= {e.src for e in graph.data_in(node.id) if e.dst_port == "index"}
            continue  # what feeds the search's queries is not where its hits come from
        for e in graph.data_in(node.id):
            if e.src not in seen:
                seen.add(e.src)
                todo.append(e.src)
    if searches == 0 or len(ingests) != 1:
        return None
    ingest = graph.nodes[next(iter(ingests))]
    return ingest if ingest.kind == PrimitiveKind.INGEST and ingest.items else None


def _pays(graph: Graph, rerank: Node, ingest: Node, ctx: PassContext) -> bool:
    """By the profiles, scoring every ingested text, from when the texts are ready, ends no
    later than the candidates are known, on another engine and device than the texts' embedder."""
    assert ingest.items is not None
    embeds = [graph.nodes[e.src] for e in graph.data_in(ingest.id) if e.dst_port == "vectors"]
    if any(e.engine == rerank.engine or ctx.same_device(e.engine, rerank.engine) for e in embeds):
        return False
    pre = ctx.latency(rerank.engine, "rerank", ingest.items)
    if pre is None:
        return False
    finish = finish_times(graph, ctx)
    texts = next(e.src for e in graph.data_in(ingest.id) if e.dst_port == "texts")
    candidates = next(e.src for e in graph.data_in(rerank.id) if e.dst_port == "docs")
    return finish[texts] + HEADROOM * pre <= finish[candidates]


def _rewrite(graph: Graph, rerank: Node, ingest: Node) -> Graph:
    editor = graph.edit()
    inputs = {e.dst_port: e for e in editor.data_in(rerank.id)}
    texts = next(e for e in editor.data_in(ingest.id) if e.dst_port == "texts")
    query, candidates = inputs["query"], inputs["docs"]

    def call(suffix: str, fn: Any, ports: Sequence[PortSpec], out: str) -> Node:
        node = Node(
            editor.fresh_id(f"{rerank.id}/{suffix}"),
            PrimitiveKind.CALL,
            tuple(ports),
            (PortSpec(out, PortType.ANY),),
            config={"fn": fn, "inline": True, ROLE: suffix},
            module=rerank.module,
            label=rerank.label,
        )
        return editor.add_node(node)

    def scorer(suffix: str, items: int | None) -> Node:
        node = Node(
            editor.fresh_id(f"{rerank.id}/{suffix}"),
            PrimitiveKind.RERANK,
            rerank.inputs,
            rerank.outputs,
            engine=rerank.engine,
            config={**rerank.config, "top_k": None, ROLE: suffix},
            caps=rerank.caps,
            items=items,
            module=rerank.module,
            label=rerank.label,
        )
        return editor.add_node(node)

    docs = call("as_documents", as_documents, [PortSpec("texts", PortType.ANY)], "value")
    editor.connect(DataEdge(texts.src, texts.src_port, docs.id, "texts", texts.select))
    pre = scorer("prescore", ingest.items)
    editor.connect(DataEdge(query.src, query.src_port, pre.id, "query", query.select))
    editor.connect(DataEdge(docs.id, "value", pre.id, "docs"))

    missing = call(
        "unscored", unscored, [PortSpec("candidates", PortType.ANY), PortSpec("scored", PortType.ANY)], "value"
    )
    editor.connect(DataEdge(candidates.src, candidates.src_port, missing.id, "candidates", candidates.select))
    editor.connect(DataEdge(pre.id, "docs", missing.id, "scored"))
    spec = spec_of(PrimitiveKind.CONDITION)
    assert spec.inputs is not None and spec.outputs is not None
    choose = editor.add_node(
        Node(
            editor.fresh_id(f"{rerank.id}/any_unscored"),
            PrimitiveKind.CONDITION,
            spec.inputs,
            spec.outputs,
            config={"predicate": any_unscored, "branches": 2, "inline": True, ROLE: "any_unscored"},
            module=rerank.module,
            label=rerank.label,
        )
    )
    editor.connect(DataEdge(missing.id, "value", choose.id, "value"))
    rest = scorer("fallback", None)
    editor.connect(DataEdge(query.src, query.src_port, rest.id, "query", query.select))
    editor.connect(DataEdge(missing.id, "value", rest.id, "docs"))
    editor.connect(ControlEdge(choose.id, rest.id, branch=1))

    _replace_with_rank(editor, rerank, candidates, pre, rest)
    editor.note(
        f"{RerankPrescoring.name}: {rerank.describe()} looks up scores {pre.id} computes for the "
        f"{ingest.items} texts {ingest.id} ingests (beside their embedding); {rest.id} scores any other candidate"
    )
    return editor.freeze()


def _replace_with_rank(editor: GraphEditor, rerank: Node, candidates: DataEdge, pre: Node, rest: Node) -> None:
    """The rerank becomes an inline CALL of `rank` under the same id: its consumers, order
    edges and id (in traces and errors) stay."""
    for e in editor.data_in(rerank.id):
        editor.disconnect(e)
    ports = (
        PortSpec("candidates", PortType.ANY),
        PortSpec("scored", PortType.ANY),
        PortSpec("rest", PortType.ANY, optional=True),
    )
    top_k = rerank.config.get("top_k")
    editor.replace_node(
        Node(
            rerank.id,
            PrimitiveKind.CALL,
            ports,
            (PortSpec("docs", PortType.SCORED),),
            config={"fn": partial(rank, top_k=top_k), "inline": True, ROLE: "rank"},
            caps=Capabilities(),
            module=rerank.module,
            label=rerank.label,
        )
    )
    editor.connect(DataEdge(candidates.src, candidates.src_port, rerank.id, "candidates", candidates.select))
    editor.connect(DataEdge(pre.id, "docs", rerank.id, "scored"))
    editor.connect(DataEdge(rest.id, "docs", rerank.id, "rest"))
