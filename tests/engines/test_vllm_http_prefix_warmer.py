"""The one prefix warmer's rule (`teola_adapters.vllm_http.PrefixWarmer`), on the simulated vLLM server.

The server is real HTTP (`SimServers`: vLLM's `/tokenize`, `/metrics`, token-id prompts).
A failing warm-up is one the server refuses as vLLM does: a chat tokenize asked both to
continue the last message and to add a generation prompt (HTTP 400); a server without
vLLM's endpoints answers 404. Each adapter's use of the rule: tests/langchain_adapter/
test_lc_prefix_warmup.py and tests/llamaindex_adapter/test_li_openai_like.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

pytest.importorskip("openai")
pytest.importorskip("tenacity")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from teola_adapters.simulated.prefix_cache import BLOCK_TOKENS
from teola_adapters.simulated.servers import SimServers
from teola_adapters.vllm_http import PrefixWarmer, VLLMHTTPEngine, WarmupPrompt

WORDS = " ".join(f"w{i}" for i in range(3 * BLOCK_TOKENS))  # the simulated tokenizer: one token a word
HELD = 3 * BLOCK_TOKENS  # a `prompt`'s warm-up: "prefix", "N:" and WORDS, its whole blocks but the last token
REFUSED = WarmupPrompt(  # vLLM refuses this combination (HTTP 400), as the simulated server does
    messages=({"role": "user", "content": WORDS},),
    continue_final_message=True,
    template=(("add_generation_prompt", True),),
)


@pytest.fixture
def servers() -> Iterator[SimServers]:
    with SimServers(time_scale=0.01) as s:
        yield s


def prompt(n: int) -> WarmupPrompt:
    return WarmupPrompt(text=f"prefix {n}: {WORDS}")


def test_two_failures_in_a_row_are_tolerated_and_the_third_stops(servers) -> None:
    warmer = PrefixWarmer(VLLMHTTPEngine(servers.root_url, "sim-7b", retries=0))

    async def run() -> list[int]:
        sent = [await warmer.warm(REFUSED), await warmer.warm(REFUSED), await warmer.warm(prompt(0))]
        assert warmer.stats.failures == 2 and not warmer.stopped  # a success starts the count again
        sent += [await warmer.warm(REFUSED), await warmer.warm(REFUSED)]
        assert warmer.stats.failures == 4 and not warmer.stopped
        sent.append(await warmer.warm(REFUSED))
        assert warmer.stopped and "3 warm-ups failed in a row" in (warmer.stats.disabled or "")
        asked = servers.backend.requests["tokenize"]
        sent.append(await warmer.warm(prompt(1)))  # stopped: not even tokenized
        assert servers.backend.requests["tokenize"] == asked == 6
        return sent

    assert asyncio.run(run()) == [0, 0, HELD, 0, 0, 0, 0]
    assert warmer.stats.warmups == 1 and warmer.stats.failures == 5


def test_a_server_without_vllms_tokenizer_stops_the_warm_ups_at_once() -> None:
    with SimServers(time_scale=0.01, vllm_api=False) as servers:
        warmer = PrefixWarmer(VLLMHTTPEngine(servers.root_url, "sim-7b", retries=0))

        async def run() -> None:
            assert await warmer.warm(prompt(0)) == 0
            assert warmer.stopped and "HTTP 404" in (warmer.stats.disabled or "")
            assert await warmer.warm(prompt(1)) == 0

        asyncio.run(run())
    assert warmer.stats.failures == 1 and warmer.stats.warmups == 0


def test_recent_prefixes_are_not_sent_again_until_forgotten(servers) -> None:
    warmer = PrefixWarmer(VLLMHTTPEngine(servers.root_url, "sim-7b", retries=0), memo=2)

    async def run() -> list[int]:
        return [await warmer.warm(prompt(n)) for n in (0, 1, 1, 0, 2, 0, 1)]

    sent = asyncio.run(run())
    # 1 and 0 are remembered; 2 pushes out 1 (0 was used more recently), so 1 is sent again.
    assert [n > 0 for n in sent] == [True, True, False, False, True, False, True]
    assert warmer.stats.warmups == 4 and warmer.stats.repeats == 3


def test_a_factory_makes_one_engine_per_event_loop_and_the_first_reads_the_block_size(servers) -> None:
    made: list[VLLMHTTPEngine] = []

    def make() -> VLLMHTTPEngine:
        made.append(VLLMHTTPEngine(servers.root_url, "sim-7b", retries=0, block_size=4))
        return made[-1]

    warmer = PrefixWarmer(make=make)

    async def twice(n: int) -> list[int]:  # two warm-ups on one loop: one engine, closed with the loop's work
        sent = await asyncio.gather(warmer.warm(prompt(n)), warmer.warm(prompt(n + 1)))
        await warmer.aclose()
        assert made[-1].client.is_closed()
        return list(sent)

    assert asyncio.run(twice(0)) == asyncio.run(twice(2)) == [HELD] * 2
    assert len(made) == 2 and warmer.block_size == BLOCK_TOKENS  # /metrics says 16, not the engine's 4
    assert [engine.block_size for engine in made] == [BLOCK_TOKENS, BLOCK_TOKENS]


def test_give_a_server_or_a_factory() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        PrefixWarmer()
