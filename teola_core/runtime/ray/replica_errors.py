"""Why a pool's calls cannot run: the `EngineUnavailableError`s read from its replicas' records.

`final` errors (the pool failed or closed, or no replica can come back) tell `Replicas`
that waiting or a placement check cannot help.
"""

from __future__ import annotations

from collections.abc import Sequence

from teola_core.runtime.ray.actor import EngineUnavailableError
from teola_core.runtime.ray.replica_state import ReplicaSlot


def pool_unavailable(
    name: str, replicas: Sequence[ReplicaSlot], failed: BaseException | None, closed: bool
) -> EngineUnavailableError | None:
    """Why no call can run now, or None when waiting may help."""
    if failed is not None:
        error = EngineUnavailableError(
            f"engine {name!r}: its Ray actors could not start: {failed}", engine=name, final=True
        )
        error.__cause__ = failed
        return error
    if closed:
        return EngineUnavailableError(f"engine {name!r}: its Ray pool is closed", engine=name, final=True)
    if all(r.state == "lost" for r in replicas):
        why = "; ".join(dict.fromkeys(r.why for r in replicas))
        final = all(r.final for r in replicas)
        message = f"engine {name!r}: no replica can run: {why}"
        return EngineUnavailableError(message, engine=name, final=final)
    return None


def replica_cannot_run(name: str, replica: ReplicaSlot, replicas: int) -> EngineUnavailableError:
    """One replica is lost: a pool waiting for all of them to be ready cannot be."""
    message = f"engine {name!r}: replica {replica.slot + 1} of {replicas} cannot run: {replica.why}"
    return EngineUnavailableError(message, engine=name, final=replica.final)


def none_ready(name: str, replica_wait_s: float, states: Sequence[str]) -> EngineUnavailableError:
    """No replica was ready within the pool's `replica_wait_s`."""
    return EngineUnavailableError(
        f"engine {name!r}: no replica was ready within replica_wait_s={replica_wait_s} (replicas: {', '.join(states)})",
        engine=name,
    )
