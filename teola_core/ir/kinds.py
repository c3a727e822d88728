"""Primitive kinds and what each one declares about itself.

The paper's Table 1 primitives plus the structural ones every graph needs. A kind's
declaration (`KindSpec`) is the single source of truth for its ports and capabilities:
passes read capabilities from nodes, and nodes get them from here (narrowed by an
engine's declaration), never from config key names.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from teola_core.ir.types import PortType


class PrimitiveKind(StrEnum):
    INPUT = "input"
    OUTPUT = "output"
    EMBED = "embed"
    INGEST = "ingest"
    SEARCH = "search"
    RERANK = "rerank"
    PREFILL = "prefill"
    PARTIAL_PREFILL = "partial_prefill"
    FULL_PREFILL = "full_prefill"
    DECODE = "decode"
    PARTIAL_DECODE = "partial_decode"
    AGGREGATE = "aggregate"
    CONDITION = "condition"
    CALL = "call"
    FORMAT = "format"


class Placement(StrEnum):
    """Where a primitive runs."""

    ENGINE = "engine"  # sent to an engine through its engine scheduler
    INLINE = "inline"  # cheap and pure: the runtime computes it on the spot
    USER = "user"  # user code (a `call` or a condition predicate): run off the event loop


class MergeMode(StrEnum):
    """How the outputs of the stages of a split primitive are joined again."""

    CONCAT = "concat"  # list outputs, concatenated in stage order
    TOPK = "topk"  # scored lists: stable sort by score (desc), keep top_k
    BARRIER = "barrier"  # equal handles (e.g. one index): wait for all, pass one on
    SELECT = "select"  # exactly one branch produced a value: pass it on


@dataclass(frozen=True)
class PortSpec:
    name: str
    type: PortType
    optional: bool = False


@dataclass(frozen=True)
class Capabilities:
    """What the scheduler and the passes may do with a node.

    batchable: calls of several nodes may share one engine invocation.
    splittable: the node may be cut into stages along its item ports.
    item_inputs: input ports that are item-aligned lists (sliced together on a split).
    item_output: the output port that is item-aligned with the inputs, if any.
    merge: how stage outputs are joined (see `MergeMode`).
    """

    batchable: bool = False
    splittable: bool = False
    item_inputs: tuple[str, ...] = ()
    item_output: str | None = None
    merge: MergeMode | None = None

    def narrowed(self, *, batchable: bool = True, splittable: bool = True) -> Capabilities:
        """The same capabilities with some switched off (an engine can only remove)."""
        return Capabilities(
            batchable=self.batchable and batchable,
            splittable=self.splittable and splittable,
            item_inputs=self.item_inputs,
            item_output=self.item_output,
            merge=self.merge,
        )


@dataclass(frozen=True)
class KindSpec:
    """Fixed ports (None where each node declares its own) and default capabilities."""

    kind: PrimitiveKind
    placement: Placement
    inputs: tuple[PortSpec, ...] | None
    outputs: tuple[PortSpec, ...] | None
    caps: Capabilities = Capabilities()


def _p(name: str, type_: PortType, optional: bool = False) -> PortSpec:
    return PortSpec(name, type_, optional)


_T = PortType
KIND_SPECS: dict[PrimitiveKind, KindSpec] = {
    spec.kind: spec
    for spec in (
        KindSpec(PrimitiveKind.INPUT, Placement.INLINE, (), None),
        KindSpec(PrimitiveKind.OUTPUT, Placement.INLINE, None, ()),
        KindSpec(
            PrimitiveKind.EMBED,
            Placement.ENGINE,
            (_p("texts", _T.TEXTS),),
            (_p("vectors", _T.VECTORS),),
            Capabilities(True, True, ("texts",), "vectors", MergeMode.CONCAT),
        ),
        KindSpec(
            PrimitiveKind.INGEST,
            Placement.ENGINE,
            (_p("texts", _T.TEXTS), _p("vectors", _T.VECTORS)),
            (_p("index", _T.INDEX),),
            Capabilities(True, True, ("texts", "vectors"), None, MergeMode.BARRIER),
        ),
        KindSpec(
            PrimitiveKind.SEARCH,
            Placement.ENGINE,
            (_p("vectors", _T.VECTORS), _p("index", _T.INDEX)),
            (_p("hits", _T.HITS),),
            Capabilities(True, True, ("vectors",), "hits", MergeMode.CONCAT),
        ),
        KindSpec(
            PrimitiveKind.RERANK,
            Placement.ENGINE,
            (_p("query", _T.TEXT), _p("docs", _T.DOCS)),
            (_p("docs", _T.SCORED),),
            Capabilities(True, True, ("docs",), "docs", MergeMode.TOPK),
        ),
        KindSpec(
            PrimitiveKind.PREFILL,
            Placement.ENGINE,
            (_p("prompt", _T.PROMPT),),
            (_p("kv", _T.KV),),
            Capabilities(batchable=True),
        ),
        KindSpec(
            PrimitiveKind.PARTIAL_PREFILL,
            Placement.ENGINE,
            (_p("prefix", _T.PROMPT),),
            (_p("kv", _T.KV),),
            Capabilities(batchable=True),
        ),
        KindSpec(
            PrimitiveKind.FULL_PREFILL,
            Placement.ENGINE,
            (_p("prompt", _T.PROMPT), _p("prefix_kv", _T.KV)),
            (_p("kv", _T.KV),),
            Capabilities(batchable=True),
        ),
        # DECODE declares "items" only when its node has a split unit (see builder).
        KindSpec(PrimitiveKind.DECODE, Placement.ENGINE, (_p("kv", _T.KV),), None, Capabilities(batchable=True)),
        KindSpec(
            PrimitiveKind.PARTIAL_DECODE,
            Placement.ENGINE,
            None,
            None,
            Capabilities(batchable=True),
        ),
        KindSpec(PrimitiveKind.AGGREGATE, Placement.INLINE, None, (_p("value", _T.ANY),)),
        KindSpec(PrimitiveKind.CONDITION, Placement.USER, (_p("value", _T.ANY),), (_p("branch", _T.BRANCH),)),
        KindSpec(PrimitiveKind.CALL, Placement.USER, None, None),
        KindSpec(PrimitiveKind.FORMAT, Placement.INLINE, None, (_p("prompt", _T.PROMPT),)),
    )
}

PREFILL_KINDS = frozenset({PrimitiveKind.PREFILL, PrimitiveKind.PARTIAL_PREFILL, PrimitiveKind.FULL_PREFILL})
DECODE_KINDS = frozenset({PrimitiveKind.DECODE, PrimitiveKind.PARTIAL_DECODE})
LLM_KINDS = PREFILL_KINDS | DECODE_KINDS


def spec_of(kind: PrimitiveKind) -> KindSpec:
    return KIND_SPECS[kind]
