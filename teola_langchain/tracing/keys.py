"""Names of a chain's steps that both a traced graph and LangChain's callback runs give.

A step's key is the path of callback runs from the chain's root to the step's own run:
each run by its name and the tag its composite gives it (`seq:step:2`, `map:key:context`,
`branch:1`, `condition:1`; none under a `.map()` or a retriever). The root itself is
`CHAIN`. The tracer computes a key from a step's position; the observer
(`learning.Observer`) from the runs it sees: the same step, the same key, whether the
call ran on Teola's graph or as LangChain runs it.

    step:RunnableParallel<context,question>[seq:step:1]/RunnableSequence[map:key:context]/MyRetriever[seq:step:1]
"""

from __future__ import annotations

import re
from collections.abc import Iterable

CHAIN = "chain"
PREFIX = "step:"

# The tags LangChain's composites give their children (`run_manager.get_child(tag)`).
_STRUCTURAL = re.compile(r"(seq:step:\d+|map:key:.*|branch:(\d+|default)|condition:\d+)")


def element(name: str, tag: str | None) -> str:
    return f"{name}[{tag}]" if tag else name


def child_key(parent: str, name: str, tag: str | None) -> str:
    """The key of run `name` (tagged `tag`) under the run keyed `parent`."""
    if parent == CHAIN:
        return PREFIX + element(name, tag)
    return f"{parent}/{element(name, tag)}"


def structural_tag(tags: Iterable[str], inherited: Iterable[str]) -> str | None:
    """The tag a run's composite gave it: a structural tag among its tags that its caller's
    config did not already carry (`inherited`)."""
    skip = set(inherited)
    found = [t for t in tags if t not in skip and _STRUCTURAL.fullmatch(t)]
    return found[-1] if found else None


def short(key: str) -> str:
    """A key as explain() prints it: the step's own name and tag, then the composites it is in."""
    if not key.startswith(PREFIX):
        return key
    *path, own = key[len(PREFIX) :].split("/")
    where = " > ".join(_untagged(e) for e in path)
    return own if not path else f"{own} in {where}"


def _untagged(element: str) -> str:
    return element.rsplit("[", 1)[0] if element.endswith("]") else element


def last_name(key: str) -> str:
    """The step's own run name (its key's last element without the tag)."""
    own = key[len(PREFIX) :].rsplit("/", 1)[-1] if key.startswith(PREFIX) else key
    return _untagged(own)
