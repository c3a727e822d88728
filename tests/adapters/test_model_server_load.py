"""Reading a model server's load from `/metrics`: vLLM's gauges, summed over labels."""

from __future__ import annotations

import asyncio
import math

import httpx
import pytest
import respx

from teola_adapters.server_load import MetricsUnreadable, ServerCalls, ServerWatch, parse_reading, root_of
from teola_core.scheduler.server_limit import START_LIMIT, ServerReading

VLLM_PAGE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True"} 1.0
"""


def test_vllms_gauges_are_summed_over_their_labels() -> None:
    assert parse_reading(VLLM_PAGE) == ServerReading(running=12, waiting=3, kv_usage=0.25)


@pytest.mark.parametrize(
    ("labels", "kv_tokens"),
    [
        ('block_size="16",enable_prefix_caching="True",num_gpu_blocks="2048"', 32_768),
        ('block_size="16",num_gpu_blocks="None"', None),  # vLLM before it sized its cache
    ],
)
def test_the_kv_cache_size_is_its_blocks_times_their_size(labels: str, kv_tokens: int | None) -> None:
    page = VLLM_PAGE.replace('block_size="16",enable_prefix_caching="True"', labels)
    assert parse_reading(page) == ServerReading(running=12, waiting=3, kv_usage=0.25, kv_tokens=kv_tokens)


@pytest.mark.parametrize(
    "page",
    [
        "",
        "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.0\n",
        VLLM_PAGE.split("# TYPE vllm:num_requests_waiting")[0],
    ],
)
def test_a_page_without_running_and_waiting_is_not_vllm_like(page: str) -> None:
    assert parse_reading(page) is None


# vLLM 0.32's request histograms, as its /metrics writes them (most buckets left out)
COSTS_PAGE = """\
# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} 4.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 2.5
# TYPE vllm:request_prefill_kv_computed_tokens histogram
vllm:request_prefill_kv_computed_tokens_count{engine="0",model_name="m"} 4.0
vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="m"} 1000.0
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.025",model_name="m"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="0.025",model_name="m"} 0.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.05",model_name="m"} 30.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="0.05",model_name="m"} 30.0
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 40.0
vllm:inter_token_latency_seconds_bucket{engine="1",le="+Inf",model_name="m"} 40.0
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 40.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 9.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 9.0
"""


def test_what_the_servers_work_costs_comes_from_its_request_histograms() -> None:
    reading = parse_reading(VLLM_PAGE + COSTS_PAGE)
    assert reading is not None and reading.costs is not None
    assert reading.costs.token_gaps == ((0.025, 0.0), (0.05, 60.0), (math.inf, 80.0))  # summed over engines
    assert reading.costs.prompt_token_s == 0.0025  # 2.5 s over 1,000 computed tokens
    assert reading.costs.output_token_s == pytest.approx(0.025 + 0.025 * 40 / 60)  # the median gap
    assert parse_reading(VLLM_PAGE + COSTS_PAGE.split("# TYPE vllm:inter_token")[0]).costs is None  # one missing


@pytest.mark.parametrize(
    ("bucket", "why"),
    [
        ('vllm:inter_token_latency_seconds_bucket{engine="0",model_name="m"} 3.0', "no bound"),
        (
            'vllm:inter_token_latency_seconds_bucket{engine="0",le="soon",model_name="m"} 3.0',
            "a bound that is no number",
        ),
    ],
)
def test_a_gap_histogram_teola_cannot_read_leaves_the_costs_unknown_and_the_load_read(bucket: str, why: str) -> None:
    reading = parse_reading(VLLM_PAGE + COSTS_PAGE + bucket + "\n")
    assert reading is not None and reading.running == 12 and reading.costs is None, why


def test_a_gap_histogram_with_only_its_infinite_bucket_gives_no_median() -> None:
    only_inf = COSTS_PAGE.replace('le="0.025"', 'le="+Inf"').replace('le="0.05"', 'le="+Inf"')
    reading = parse_reading(VLLM_PAGE + only_inf)
    assert reading is not None and reading.costs is not None and reading.costs.output_token_s is None


def test_the_root_of_an_openai_base_url() -> None:
    assert root_of("http://h:8000/v1") == root_of("http://h:8000/v1/") == "http://h:8000"
    assert root_of("http://h:8000") == "http://h:8000"


def _calls(page: httpx.Response) -> tuple[ServerCalls, list[int]]:
    limits: list[int] = []
    with respx.mock(base_url="http://vllm.test") as mock:
        mock.get("/metrics").mock(return_value=page)

        async def scenario() -> ServerCalls:
            calls = ServerCalls(ServerWatch("http://vllm.test"), limits.append)
            calls.want_reading()
            await calls.settled()
            return calls

        return asyncio.run(scenario()), limits


def test_a_server_that_fails_its_metrics_is_named_and_never_held() -> None:
    calls, limits = _calls(httpx.Response(500, text="boom"))
    assert calls.vllm is False and isinstance(calls.error, MetricsUnreadable) and limits == []
    assert "http://vllm.test/metrics" in str(calls.error) and "500" in str(calls.error)
    assert calls.describe().startswith("http://vllm.test: /metrics unreadable")


def test_a_vllm_server_found_at_first_use_is_bounded_from_then_on() -> None:
    calls, limits = _calls(httpx.Response(200, text=VLLM_PAGE))
    assert calls.vllm is True and calls.last == ServerReading(running=12, waiting=3, kv_usage=0.25)
    # found vLLM-like: the starting limit; requests wait there: what runs, and a little queue
    assert calls.limit.capacity == 12 and limits == [START_LIMIT, 12 + 1]
    assert "vLLM-like; runs 12 at once; Teola keeps at most 13 calls there" in calls.describe()


def test_a_404_means_not_vllm_like() -> None:
    calls, _ = _calls(httpx.Response(404))
    assert calls.vllm is False and calls.error is None


def test_a_read_that_fails_after_the_server_was_read_keeps_what_was_learned() -> None:
    pages = iter([httpx.Response(200, text=VLLM_PAGE), httpx.Response(503, text="busy")])
    limits: list[int] = []
    with respx.mock(base_url="http://vllm.test") as mock:
        mock.get("/metrics").mock(side_effect=lambda request: next(pages))

        async def scenario() -> ServerCalls:
            calls = ServerCalls(ServerWatch("http://vllm.test"), limits.append)
            for _ in range(2):
                calls.want_reading()
                await calls.settled()
            await calls.aclose()
            calls.want_reading()  # closed: no read starts
            assert calls._reading is None
            return calls

        calls = asyncio.run(scenario())
    assert calls.vllm is True and calls.limit.capacity == 12 and limits == [START_LIMIT, 13]
    assert isinstance(calls.error, MetricsUnreadable) and "the bound stays" in calls.describe()


def test_engines_on_one_server_are_counted_together() -> None:
    calls = ServerCalls(ServerWatch("http://vllm.test"), lambda n: None)
    calls.vllm = False  # no reads: only the counting is under test
    first, second = calls.watcher("chat"), calls.watcher("completion")
    first(3, 1)
    second(2, 4)
    assert (calls.in_flight, calls.held) == (5, 5)
    first(0, 0)
    assert (calls.in_flight, calls.held) == (2, 4) and calls.held_total == 5
