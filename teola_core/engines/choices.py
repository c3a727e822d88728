"""The `engines=` option of the framework drop-ins: which Teola engine runs a component.

    choices = EngineChoices([(embed_model, MyEmbedder())], ROLE_KINDS)
    engine = choices.engine(component, "embed", default)   # MyEmbedder() for embed_model, else default
    choices.check_used()                                   # a pair whose component was never seen: error

The option is one of:

- pairs `(component, engine)`, matched by identity: a list, or a dict when the
  components are hashable. A component the app does not use is an error (`check_used`).
- a function `choose(component, default) -> engine | None`, asked for every component
  the app runs on an engine; `default` is the engine Teola would use (wrap it, or fall
  back to it); None keeps it.

An app made of parts traced one by one (the chains of a LangGraph graph, the query
engines inside a router) shares one `EngineChoices`: each part gets `choices.chooser`
(the pairs, recorded as used, then the user's function) and the owner calls
`check_used()` once every part is traced. Framework adapters subclass it for what is
their own (`adapt`: an engine given for a component that keeps running the component).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from teola_core.engines.protocol import Engine, EngineSet
from teola_core.ir.kinds import PrimitiveKind

Chooser = Callable[[Any, Engine], Engine | None]
EngineOption = Mapping[Any, Engine] | Iterable[tuple[Any, Engine]] | Chooser | None


class EngineChoices:
    """The parsed `engines=` option (see the module docstring).

    role_kinds: per role a component can have, the primitive kinds its engine must run.
    """

    def __init__(self, option: EngineOption, role_kinds: Mapping[str, frozenset[PrimitiveKind]]) -> None:
        self.role_kinds = role_kinds
        self._choose: Chooser | None = None
        self._pairs: list[tuple[Any, Engine]] = []
        if option is None:
            pass
        elif isinstance(option, Mapping):
            self._pairs = list(option.items())
        elif callable(option):
            self._choose = option
        else:
            for pair in option:
                if not (isinstance(pair, tuple) and len(pair) == 2):
                    raise TypeError(f"engines=: expected (component, engine) pairs, got {pair!r}")
                self._pairs.append(pair)
        self._used: set[int] = set()

    def chooser(self, component: Any, default: Engine) -> Engine | None:
        """The engine the option names for `component` (None: the default), as a part's `engines=`."""
        chosen: Engine | None = None
        for i, (c, e) in enumerate(self._pairs):
            if c is component:
                chosen = e
                self._used.add(i)
        if chosen is None and self._choose is not None:
            chosen = self._choose(component, default)
        return chosen

    def engine(self, component: Any, role: str, default: Engine) -> Engine:
        """The engine that runs `component` in `role` (`default` unless the option names another)."""
        chosen = self.chooser(component, default)
        if chosen is None or chosen is default:
            return default
        adapted = self.adapt(component, role, default, chosen)
        if adapted is not None:
            return adapted
        if not isinstance(chosen, Engine):
            raise TypeError(f"engines=: {type(component).__name__} was given {chosen!r}, which is not a Teola Engine")
        missing = self.role_kinds[role] - chosen.kinds
        if missing:
            raise TypeError(
                f"engines=: {type(chosen).__name__} cannot run {type(component).__name__}'s primitives: "
                f"it lacks {sorted(k.value for k in missing)}"
            )
        return chosen

    def adapt(self, component: Any, role: str, default: Engine, chosen: Any) -> Engine | None:
        """An adapter's own use of a chosen engine (None: `chosen` runs the component's primitives)."""
        return None

    def unused(self) -> list[Any]:
        """The components of the pairs that no traced step used."""
        return [c for i, (c, _) in enumerate(self._pairs) if i not in self._used]

    def check_used(self) -> None:
        """Fail naming the pairs' components that no traced step runs on an engine."""
        unused = self.unused()
        if unused:
            raise ValueError(
                "engines= names components that no traced step runs on an engine (matched by identity: "
                "the app does not use them, or only inside a step Teola runs as one call, see "
                "explain()): " + ", ".join(type(c).__name__ for c in unused)
            )


class ComponentEngines:
    """One engine per component object and role, named after its class; builds the `EngineSet`.

    The framework adapters' registries subclass it with one method per kind of component,
    so every adapter names and chooses engines the same way.
    """

    def __init__(self, choices: EngineChoices) -> None:
        self.engines = EngineSet()
        self.choices = choices

    def _get(self, component: object, role: str, make: Callable[[str], Engine]) -> str:
        """The name of `component`'s engine in `role`: `make`'s, unless the `engines=` option chooses."""
        return self.engines.engine_for(component, role, lambda name: self.choices.engine(component, role, make(name)))
