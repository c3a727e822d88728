"""Prometheus metrics of one server, in its own `CollectorRegistry` (no global registry).

From the runtime hooks (one `PrimitiveSpan` per primitive, see `teola_core.runtime`):

    teola_primitive_latency_seconds{app,kind}      run time (start to end) by primitive kind
    teola_primitive_wait_seconds{app,kind}         queueing (ready to start) by primitive kind
    teola_engine_latency_seconds{app,engine}       run time of the engine's primitives
    teola_engine_batch_size{app,engine}            batch size each primitive ran in (observed once
                                                   per primitive: a batch of n counts n times)
    teola_primitive_errors_total{app,kind}         primitives that failed

Read at scrape time from the engine schedulers:

    teola_engine_queue_depth{app,engine}           nodes waiting for a batch
    teola_engine_running_batches{app,engine}       batches in flight

From the routes: `teola_requests_total{model,endpoint,status}` (503: shed, 504: past the
request deadline, 499: the client left), `teola_request_latency_seconds{model,endpoint}`,
`teola_requests_in_progress{model}`, `teola_requests_shed_total{model,reason}`,
`teola_client_disconnects_total{model,phase}` (phase: body, queued, running, streaming;
model "" when the body was not read yet); per app, read at scrape time from its admission
gate: `teola_admission_running{model}`, `teola_admission_waiting{model}`,
`teola_admission_limit{model}`; `teola_event_loop_lag_seconds`; and the process collector
(`process_resident_memory_bytes`, ...).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from teola.server.admission import Gate
from teola.server.apps import App
from teola.server.lag import LoopLag
from teola_core.runtime.base import PrimitiveSpan

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


class SpanRecorder:
    """A runtime hook that records one app's primitive spans."""

    def __init__(self, metrics: ServerMetrics, app: str) -> None:
        self._m = metrics
        self._app = app

    def on_span(self, span: PrimitiveSpan) -> None:
        kind = span.node.kind.value
        run = max(0.0, span.ended_at - span.started_at)
        self._m.primitive_latency.labels(self._app, kind).observe(run)
        self._m.primitive_wait.labels(self._app, kind).observe(max(0.0, span.started_at - span.ready_at))
        if span.error is not None:
            self._m.primitive_errors.labels(self._app, kind).inc()
        if span.node.engine is not None:
            self._m.engine_latency.labels(self._app, span.node.engine).observe(run)
            self._m.batch_size.labels(self._app, span.node.engine).observe(span.batch_size)


class _QueueCollector(Collector):
    """Queue depth and running batches, read from the apps' engine schedulers per scrape;
    admission state, read from the apps' gates."""

    def __init__(self, apps: Sequence[App], gates: Mapping[str, Gate], lag: LoopLag) -> None:
        self._apps = apps
        self._gates = gates
        self._lag = lag

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily("teola_engine_queue_depth", "Nodes waiting for a batch", labels=["app", "engine"])
        running = GaugeMetricFamily("teola_engine_running_batches", "Batches in flight", labels=["app", "engine"])
        for app in self._apps:
            for engine, (pending, batches) in app.queue_depths().items():
                depth.add_metric([app.name, engine], pending)
                running.add_metric([app.name, engine], batches)
        yield depth
        yield running
        gauges = {
            "running": GaugeMetricFamily("teola_admission_running", "Queries admitted and running", labels=["model"]),
            "waiting": GaugeMetricFamily("teola_admission_waiting", "Requests waiting for a slot", labels=["model"]),
            "limit": GaugeMetricFamily("teola_admission_limit", "Queries that may run at once now", labels=["model"]),
            "max": GaugeMetricFamily("teola_admission_max", "The most that ever may run at once", labels=["model"]),
        }
        for name, gate in self._gates.items():
            gauges["running"].add_metric([name], gate.running)
            gauges["waiting"].add_metric([name], gate.waiting)
            gauges["limit"].add_metric([name], gate.admission.limit)
            gauges["max"].add_metric([name], gate.admission.max_limit)
        yield from gauges.values()
        behind = GaugeMetricFamily("teola_event_loop_lag_seconds", "How far behind the server's event loop runs")
        behind.add_metric([], self._lag.behind())
        yield behind


class ServerMetrics:
    """Every metric of one server; `render()` is the /metrics body."""

    content_type = "text/plain; version=0.0.4; charset=utf-8"

    def __init__(self, apps: Sequence[App], gates: Mapping[str, Gate], lag: LoopLag) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        latency = partial(Histogram, registry=r, buckets=_LATENCY_BUCKETS)
        self.primitive_latency = latency("teola_primitive_latency_seconds", "Primitive run time", ["app", "kind"])
        self.primitive_wait = latency("teola_primitive_wait_seconds", "Primitive queueing time", ["app", "kind"])
        self.primitive_errors = Counter("teola_primitive_errors", "Failed primitives", ["app", "kind"], registry=r)
        self.engine_latency = latency("teola_engine_latency_seconds", "Engine primitive run time", ["app", "engine"])
        sizes = partial(Histogram, registry=r, buckets=_BATCH_BUCKETS)
        self.batch_size = sizes("teola_engine_batch_size", "Batch size primitives ran in", ["app", "engine"])
        self.requests = Counter("teola_requests", "Requests", ["model", "endpoint", "status"], registry=r)
        self.request_latency = latency("teola_request_latency_seconds", "Request latency", ["model", "endpoint"])
        self.in_progress = Gauge("teola_requests_in_progress", "Requests running", ["model"], registry=r)
        self.shed = Counter("teola_requests_shed", "Requests shed under overload", ["model", "reason"], registry=r)
        self.disconnects = Counter(
            "teola_client_disconnects", "Clients that left before their answer", ["model", "phase"], registry=r
        )
        r.register(_QueueCollector(apps, gates, lag))
        ProcessCollector(registry=r)

    def hook(self, app: str) -> SpanRecorder:
        return SpanRecorder(self, app)

    def render(self) -> bytes:
        return generate_latest(self.registry)
