"""Whether some live Ray node can take a replica: what tells a replica that cannot start
(lost, until a node that fits joins) from one that is only slow to start.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from teola_core.runtime.ray.actor import ActorInfo
from teola_core.runtime.ray.options import EngineOptions

# Scheduling options the placement check cannot model: with them, a replica is assumed placeable.
_UNMODELLED = ("scheduling_strategy", "placement_group", "label_selector", "accelerator_type")


def placement_modelled(options: EngineOptions) -> bool:
    """Whether the check can judge these options (else a replica is assumed placeable)."""
    return not any(k in options.actor_options for k in _UNMODELLED)


def unplaceable_reason(
    need: Mapping[str, float], nodes: Sequence[Mapping[str, Any]], ran_on: Iterable[ActorInfo]
) -> str | None:
    """None when some live node (of Ray's `nodes()`) offers `need`; else why none does,
    naming the nodes the replicas ran on (`ran_on`: their latest ready actors)."""
    alive = [n for n in nodes if n.get("Alive")]
    if any(all(n.get("Resources", {}).get(k, 0.0) >= v for k, v in need.items()) for n in alive):
        return None
    lost = sorted({f"{info.node_id[:12]} at {info.node_ip}" for info in ran_on})
    where = f"; it ran on node {', '.join(lost)}, which is gone" if lost else ""
    return f"no live Ray node offers what a replica needs ({_format(need)}){where}"


def _format(need: Mapping[str, float]) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in sorted(need.items()))
