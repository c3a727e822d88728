"""The Ray backend: `RayRuntime` and `RayEngines` (`runtime.py`), engine pools of actors (`pool.py`).

    from teola_core.runtime.ray import RayRuntime
    runtime = RayRuntime(engines, ray={"engines": {"llm": {"num_gpus": 1}}})

The names below load on first use, so `teola_core.runtime.ray.options` (the `ray=` option,
read by every drop-in) imports without the runtime; neither imports the `ray` library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from teola_core.runtime.ray.runtime import RayEngines, RayRuntime, connect, require_ray

__all__ = ["RayEngines", "RayRuntime", "connect", "require_ray"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from teola_core.runtime.ray import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
