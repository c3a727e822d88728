"""KV affinity across a pool's replicas: a KV handle names the actor that holds its state.

Each replica has its own engine, so a KV handle one actor produced means something to
that actor only. The pool tags the handle's engine-private token with its own id, the
actor's slot and the actor's id (`pin_kv_handles`); a later call with the handle is sent
to that actor, the token untagged again (`unpin_call`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from teola_core.engines.protocol import Call, CallResult
from teola_core.ir.types import KVHandle
from teola_core.runtime.ray.actor import ActorInfo


@dataclass(frozen=True)
class PinnedToken:
    """A KV handle's engine-private token, tagged with the pool and actor that hold its state."""

    pool: str
    slot: int
    actor_id: str
    token: Any


def pin_kv_handles(pool: str, info: ActorInfo | None, result: CallResult) -> CallResult:
    """`result` with each KV handle's token pinned to the actor `info` of pool `pool`."""
    if info is None or isinstance(result, BaseException) or not isinstance(result, Mapping):
        return result
    if not any(isinstance(v, KVHandle) for v in result.values()):
        return result
    return {
        k: dataclasses.replace(v, token=PinnedToken(pool, info.slot, info.actor_id, v.token))
        if isinstance(v, KVHandle)
        else v
        for k, v in result.items()
    }


def unpin_call(pool: str, call: Call) -> tuple[PinnedToken | None, Call]:
    """The pin of this call's KV state (if any), and the call as the actor gets it (plain handles).

    Only the query id, node and inputs travel: per-query state of the driver stays there.
    """
    pin: PinnedToken | None = None
    inputs = dict(call.inputs)
    for port, value in call.inputs.items():
        if isinstance(value, KVHandle) and isinstance(value.token, PinnedToken) and value.token.pool == pool:
            pin = value.token if pin is None else pin
            inputs[port] = dataclasses.replace(value, token=value.token.token)
    return pin, Call(call.query_id, call.node, inputs)
