"""The options of an app whose parts are optimized one by one, checked for the app as a whole.

A LangGraph graph's LCEL chain nodes, the `RetrieverQueryEngine`s inside a LlamaIndex
router: each part is traced and placed on its own (its own engines, runtimes and Ray
actors), but the user gave `engines=` and `ray=` once, for the app. So each part gets
`part_options()` — the pairs as a chooser that records what it matched, the Ray options
`for_parts` (a key that matches none of this part's engines is left to the others) — and
once every part is built `check(parts)` fails on a pair or a key that no part used.

    shared = SharedOptions(EngineChoices(engines, ROLE_KINDS), backend, ray)
    parts = [Part(p, backend=backend, **shared.part_options()) for p in app_parts]
    shared.check([part.engine_set for part in parts])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from teola_core.engines.choices import EngineChoices
from teola_core.engines.protocol import EngineSet
from teola_core.runtime.backends import check_backend
from teola_core.runtime.ray.options import RayOptions


class SharedOptions:
    """`engines=` and `ray=` of an app made of parts (see the module docstring)."""

    def __init__(self, choices: EngineChoices, backend: str, ray: RayOptions | Mapping[str, Any] | None) -> None:
        check_backend(backend, ray)
        self.choices = choices
        given = RayOptions.parse(ray)
        self.owner = not given.partial  # a part of a part leaves the keys to the app's owner
        self.ray = given.for_parts() if backend == "ray" else None

    def part_options(self) -> dict[str, Any]:
        """The `engines=` and `ray=` options to give each part."""
        options: dict[str, Any] = {"engines": self.choices.chooser}
        if self.ray is not None:
            options["ray"] = self.ray
        return options

    def check(self, parts: Sequence[EngineSet]) -> None:
        """Fail on an `engines=` pair or a `ray=` engine key that no part's engines matched."""
        self.choices.check_used()
        if self.ray is not None and self.owner:
            self.ray.check_keys(parts)
