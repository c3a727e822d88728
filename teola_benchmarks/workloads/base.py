"""What a benchmark workload is: a template, how to make its queries, its fake model."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from teola_benchmarks.workflow import WorkflowTemplate
from teola_benchmarks.workloads.common import FakeModel


@dataclass(frozen=True)
class Workload:
    """`template(time_scale)` builds the workflow template; the scale reaches the
    workload's own opaque calls (a web search API) the way it reaches the engines."""

    name: str
    description: str
    template: Callable[[float], WorkflowTemplate]
    make_query: Callable[[int], Mapping[str, Any]]
    model: FakeModel
