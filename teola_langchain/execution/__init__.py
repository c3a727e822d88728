"""Running a traced chain's steps as LangChain runs them: same methods, configs, contexts, runs.

`steps.py` holds the functions behind the tracer's user nodes, `runs.py` how each is
invoked and how composite runs open and close, `context.py` one query's state. A step
that starts early (`early_runs.py`) holds its callbacks back (`deferred_callbacks.py`);
`batch`/`abatch` run every input as a query of their own (`batch_calls.py`, `batching.py`).
"""
