"""Rerank pre-scoring: score what a query ingests while its embeddings are computed.

A rerank whose candidates come from a search over an index the same query builds (a
document-QA app indexing the query's document) waits on the critical path for the
embeddings, the ingest and the search, and only then scores its candidates. Every
candidate such a search can return is one of the ingested texts, which are known from
the start: the reranker, idle meanwhile, can score them all beside the embedder, and the
rerank after the search becomes a lookup.

    embed(T) -> ingest -> search -> ... -> rerank(q, candidates)          becomes
    embed(T) -> ingest -> search -> ... -> candidates ───┐
    rerank(q, T[0:k]), rerank(q, T[k:2k]), ... = scores ─┼-> rank (lookup, the rerank's id)
      unscored(candidates, scores) -> any? ─branch 1─> rerank(q, unscored) ┘ (optional)

Exact: a RERANK whose engine declares it splittable scores each (query, document text)
pair on its own (the contract its staged form, `MergeMode.TOPK`, relies on too), so the
lookup's scores are the ones the rerank would have computed (a reranker that normalises
over its list or ranks it as a whole declares itself not splittable, and is left alone),
and `rank` orders as the engine does: best first, ties in candidate order, cut to
`top_k`. A candidate with no score (not among the ingested texts) is scored by a
fallback RERANK, which a condition skips when there is none, so an unused fallback
never queues at the reranker.

Never at the expense of other work (`teola_core.ir.speculation`): the pieces are
speculative, so the reranker starts one only when it has nothing else to do, and the
pieces not started when the candidates are known are given up (their candidates go to
the fallback rerank). Under load, or with a reranker slower than its profile, the pass
costs at most one piece's wait; the pieces are as small as their cost allows (`_pieces`).

Only where it can pay, by the profiles (`estimates.finish_times`, one query alone):
scoring all |T| texts from when they and the rerank's query are ready must end before
the candidates are known (the embedding, ingest, the queries' own path and the search it
hides behind), on another engine and device than the texts' embedder
(`EngineLimits.device`: a reranker on the embedder's CPU or model would only take turns
with it). No rerank profile: no rewrite (it costs |T| / candidates times the rerank's
work, so it is not done blind). A rerank inside a branch is left alone (its pre-scoring
would run whether or not the branch is taken).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from teola_core.ir.graph import Graph, GraphEditor
from teola_core.ir.kinds import Capabilities, PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import ControlEdge, DataEdge, ItemSlice, Node
from teola_core.ir.speculation import SPECULATIVE, Speculation
from teola_core.ir.types import Document, PortType, Scored
from teola_core.passes.base import Pass, PassContext
from teola_core.passes.estimates import finish_times

ROLE = "prescoring"  # config key on the nodes this pass adds: they are never rewritten again
# The most reranker work the pieces may add over one batch of every text. Measured on
# advanced RAG (48 texts, 12 candidates): pieces of 12 (7.5 % more work) lost 0.5 % of
# mean latency at 0.5 q/s and 1.8 % at 1.0 q/s to other queries' work run between them;
# pieces of 24 (1.5 % more) lost nothing.
SPLIT_COST = 1.05


def as_documents(texts: Sequence[Any]) -> list[Document]:
    """The ingested texts as the documents the reranker scores (documents stay as they are)."""
    return [t if isinstance(t, Document) else Document(f"prescored/{i}", t) for i, t in enumerate(texts)]


def unscored(candidates: Sequence[Any], **parts: Sequence[Scored]) -> list[Any]:
    """Candidates without a pre-computed score in any part (anything not a Document goes
    to the fallback rerank too, which fails on it as the original rerank would)."""
    known = {s.doc.text for part in parts.values() for s in part}
    return [d for d in candidates if not (isinstance(d, Document) and d.text in known)]


def any_unscored(missing: Sequence[Any]) -> int:
    """Branch 1 (run the fallback rerank) when some candidate has no score."""
    return 1 if missing else 0


def rank(
    candidates: Sequence[Document], top_k: int | None, rest: Sequence[Scored] = (), **parts: Sequence[Scored]
) -> list[Scored]:
    """The rerank's result from known scores: best first, ties in candidate order."""
    score = {s.doc.text: s.score for part in parts.values() for s in part}
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
            if found is None or (pieces := _pieces(current, node, found, ctx)) is None:
                continue
            current = _rewrite(current, node, found, pieces)
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


def _pieces(graph: Graph, rerank: Node, ingest: Node, ctx: PassContext) -> list[ItemSlice] | None:
    """How to split the pre-scoring, or None where it does not pay.

    By the profiles, scoring every ingested text, from when the texts and the rerank's
    query are ready, must end no later than the candidates are known, on another engine
    and device than the texts' embedder. A piece started just before other work arrives
    at the reranker delays that work by up to one piece (the engine starts pieces only
    when idle), so pieces are as small as their cost allows: from the rerank's own
    candidate count up, the first size whose pieces fit and cost at most `SPLIT_COST`
    times one batch of every text (each piece adds the batch's fixed cost), else one.
    """
    assert ingest.items is not None
    embeds = [graph.nodes[e.src] for e in graph.data_in(ingest.id) if e.dst_port == "vectors"]
    if any(e.engine == rerank.engine or ctx.same_device(e.engine, rerank.engine) for e in embeds):
        return None
    whole = ctx.latency(rerank.engine, "rerank", ingest.items)
    if whole is None:
        return None
    finish = finish_times(graph, ctx)
    texts = next(e.src for e in graph.data_in(ingest.id) if e.dst_port == "texts")
    inputs = {e.dst_port: e.src for e in graph.data_in(rerank.id)}
    slack = finish[inputs["docs"]] - max(finish[texts], finish[inputs["query"]])
    if whole > slack:
        return None
    size = rerank.items or ingest.items
    while size < ingest.items:  # the last piece is open-ended: more texts at run time are scored too
        pieces = ItemSlice.split(ingest.items, size)
        cost = sum(ctx.latency(rerank.engine, "rerank", p.count(ingest.items)) or 0.0 for p in pieces)
        if cost <= min(slack, SPLIT_COST * whole):
            return pieces
        size *= 2
    return ItemSlice.split(ingest.items, ingest.items)


def _rewrite(graph: Graph, rerank: Node, ingest: Node, pieces: Sequence[ItemSlice]) -> Graph:
    assert ingest.items is not None
    editor = graph.edit()
    inputs = {e.dst_port: e for e in editor.data_in(rerank.id)}
    texts = next(e for e in editor.data_in(ingest.id) if e.dst_port == "texts")
    query, candidates = inputs["query"], inputs["docs"]
    parts = [f"scored_{i}" for i in range(len(pieces))]

    def call(suffix: str, fn: Any, ports: Sequence[str], out: str) -> Node:
        node = Node(
            editor.fresh_id(f"{rerank.id}/{suffix}"),
            PrimitiveKind.CALL,
            tuple(PortSpec(p, PortType.ANY) for p in ports),
            (PortSpec(out, PortType.ANY),),
            config={"fn": fn, "inline": True, ROLE: suffix},
            module=rerank.module,
            label=rerank.label,
        )
        return editor.add_node(node)

    def scorer(suffix: str, items: int | None, **config: Any) -> Node:
        node = Node(
            editor.fresh_id(f"{rerank.id}/{suffix}"),
            PrimitiveKind.RERANK,
            rerank.inputs,
            rerank.outputs,
            engine=rerank.engine,
            config={**rerank.config, "top_k": None, ROLE: suffix, **config},
            caps=rerank.caps,
            items=items,
            module=rerank.module,
            label=rerank.label,
        )
        return editor.add_node(node)

    docs = call("as_documents", as_documents, ["texts"], "value")
    editor.connect(DataEdge(texts.src, texts.src_port, docs.id, "texts", texts.select))
    missing = call("unscored", unscored, ["candidates", *parts], "value")
    editor.connect(DataEdge(candidates.src, candidates.src_port, missing.id, "candidates", candidates.select))
    # Each piece takes only idle reranker time and is given up unstarted once the
    # candidates are known: the candidates it would have scored go to the fallback rerank.
    scorers = []
    for i, (part, piece) in enumerate(zip(parts, pieces, strict=True)):
        suffix = "prescore" if len(pieces) == 1 else f"prescore/{i}"
        pre = scorer(suffix, piece.count(ingest.items), **{SPECULATIVE: Speculation(missing.id, {"docs": ()})})
        editor.connect(DataEdge(query.src, query.src_port, pre.id, "query", query.select))
        editor.connect(DataEdge(docs.id, "value", pre.id, "docs", piece))
        editor.connect(DataEdge(pre.id, "docs", missing.id, part))
        scorers.append(pre)

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

    _replace_with_rank(editor, rerank, candidates, dict(zip(parts, scorers, strict=True)), rest)
    editor.note(
        f"{RerankPrescoring.name}: {rerank.describe()} looks up scores that {len(scorers)} speculative "
        f"rerank(s) compute for the {ingest.items} texts {ingest.id} ingests (beside their embedding, in "
        f"idle reranker time only); {rest.id} scores any other candidate"
    )
    return editor.freeze()


def _replace_with_rank(
    editor: GraphEditor, rerank: Node, candidates: DataEdge, scorers: Mapping[str, Node], rest: Node
) -> None:
    """The rerank becomes an inline CALL of `rank` under the same id: its consumers, order
    edges and id (in traces and errors) stay. `scorers`: rank's port for each piece's scores."""
    for e in editor.data_in(rerank.id):
        editor.disconnect(e)
    ports = (
        PortSpec("candidates", PortType.ANY),
        *(PortSpec(part, PortType.ANY) for part in scorers),
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
    for part, pre in scorers.items():
        editor.connect(DataEdge(pre.id, "docs", rerank.id, part))
    editor.connect(DataEdge(rest.id, "docs", rerank.id, "rest"))
