"""Tracing: a LangChain runnable into Teola's graph, structurally, without running it.

`tracer.trace(chain, engines)` gives a `traced.TracedChain`. The tracer is one class built
in layers: `GraphTracer` (`tracer.py`) on `Composites` (`composites.py`, with `EarlyStart`
from `early_steps.py`) on `PipelinedMaps` (`pipelining.py`) on `StepNodes`
(`step_nodes.py`) on `GraphWriter` (`graph_writer.py`). What it knows of values
(`values.py`), step keys (`keys.py`), what one trace shares (`session.py`) and the advice
for opaque steps (`advice.py`) live beside it.
"""
