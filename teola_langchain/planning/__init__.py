"""Plans of a chain: whether its calls run on Teola's graph, and what that gains.

`plans.Planner` traces a chain and runs the passes with the profiles; calls teach
latencies (`learning.py`) and the chain is planned again when they change
(`replanning.py`); `explain()` reads the plan (`explain.py`, `plan_report.py`).
"""
