"""An LLM engine on vLLM in this process: vLLM's async engine (`AsyncLLM`), no HTTP server.

    engine = await VLLMLocalEngine.create(model="HuggingFaceTB/SmolLM2-135M-Instruct")
    engines = EngineSet().add(engine)

PARTIAL_PREFILL warms vLLM's prefix cache with the prompt's whole cacheable blocks;
PREFILL/FULL_PREFILL are lazy (the decode request prefills, finding the warmed blocks);
DECODE runs the prompt with the node's sampling; one engine serves every event loop of
its process. How each primitive maps onto vLLM, the event loops, stats and faults:
`docs/engines.md`, "vLLM in-process".
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from teola_adapters import _llm as llm_helpers
from teola_adapters._llm import DECODES, LLM_KINDS, PREFILLS, decode_outputs, own_handle, prompt_text
from teola_adapters._profiles import ProfileSource, load_profile
from teola_adapters.server_priority import call_priority
from teola_adapters.vllm_local.dependency import import_vllm
from teola_adapters.vllm_local.errors import VLLMLocalError, brief
from teola_adapters.vllm_local.request_settings import (
    cache_salt,
    model_sampling_defaults,
    sampling_settings,
    vllm_prompt,
)
from teola_adapters.vllm_local.stats import VLLMLocalStats, prefix_cache_logger
from teola_core.engines.protocol import Call, CallResult, Engine, EngineLimits
from teola_core.engines.retention import KVPool
from teola_core.ir.kinds import PrimitiveKind
from teola_core.ir.types import KVHandle
from teola_core.runtime.loop_thread import LoopThread

T = TypeVar("T")


class VLLMLocalEngine(Engine, KVPool):
    """LLM primitives on a vLLM engine in this process (see the module doc).

    model: a model folder or hub name, as for `vllm serve`.
    engine_args: any other `vllm.AsyncEngineArgs` field (`max_model_len`, `dtype`,
      `enforce_eager`, `scheduling_policy="priority"`, `kv_cache_memory_bytes`, ...);
      `enable_prefix_caching` defaults to True.

        llm = VLLMLocalEngine("/models/SmolLM2-135M-Instruct", max_model_len=2048)
        out = await llm.run_one(Call("q", decode_node, {"kv": KVHandle("llm", "Hello")}))
        await llm.close()
    """

    def __init__(
        self,
        model: str,
        *,
        name: str = "llm",
        default_max_tokens: int = 256,
        concurrency: int = 64,
        profile: ProfileSource = None,
        **engine_args: Any,
    ) -> None:
        vllm = import_vllm()
        self.model = str(model)
        self.name = name
        self.kinds = LLM_KINDS
        self.limits = EngineLimits(concurrency=concurrency)
        self.profile = load_profile(profile, name)
        self.default_max_tokens = default_max_tokens
        self.stats = VLLMLocalStats()
        self._vllm = vllm
        self._output_kind = importlib.import_module("vllm.sampling_params").RequestOutputKind
        self._home = LoopThread(f"teola-vllm-{name}")
        self._closed = False
        args = vllm.AsyncEngineArgs(model=self.model, **{"enable_prefix_caching": True, **engine_args})
        try:
            self._llm = self._home.run(self._start(args))
        except BaseException as exc:
            self._home.close()
            if isinstance(exc, Exception):
                raise VLLMLocalError(f"vLLM engine {name!r} failed to start model {self.model}: {brief(exc)}") from exc
            raise
        config = self._llm.vllm_config
        self.block_size: int = int(config.cache_config.block_size)
        self.prefix_caching: bool = bool(config.cache_config.enable_prefix_caching)
        self.priority_scheduling: bool = config.scheduler_config.policy == "priority"
        self._sampling_defaults = model_sampling_defaults(config.model_config)

    @classmethod
    async def create(cls, model: str, **kwargs: Any) -> VLLMLocalEngine:
        """Build the engine without blocking the running event loop while vLLM starts."""
        return await asyncio.to_thread(cls, model, **kwargs)

    async def _start(self, args: Any) -> Any:
        # On vLLM's loop: the engine client binds to the loop it starts on.
        return self._vllm.AsyncLLMEngine.from_engine_args(
            args, stat_loggers=[prefix_cache_logger(self._count_prefix_cache)]
        )

    # -- the protocol ----------------------------------------------------------------
    async def run(self, calls: Sequence[Call]) -> list[CallResult]:
        """Every call as its own vLLM request, concurrently; a failing call fails alone."""
        return list(await asyncio.gather(*(self._run_call(c) for c in calls), return_exceptions=True))

    async def stream(self, call: Call) -> AsyncIterator[str]:
        """The decode's text deltas as vLLM produces them (handed over from vLLM's loop)."""
        llm_helpers.check_streamable(call, self.name)
        request = self._decode_request(call, stream=True)
        self.stats.decodes += 1
        loop = asyncio.get_running_loop()
        deltas: asyncio.Queue[tuple[bool, str]] = asyncio.Queue()

        def hand_over(item: tuple[bool, str]) -> None:
            with contextlib.suppress(RuntimeError):  # the consumer's loop is closed: nobody is listening
                loop.call_soon_threadsafe(deltas.put_nowait, item)

        async def produce() -> None:
            async for out in self._generate(*request):
                if out.outputs and out.outputs[0].text:
                    hand_over((False, out.outputs[0].text))
                if out.finished:
                    self.stats.decode_cached_tokens += int(getattr(out, "num_cached_tokens", None) or 0)

        future = asyncio.run_coroutine_threadsafe(produce(), self._loop())
        future.add_done_callback(lambda _: hand_over((True, "")))
        try:
            while True:
                done, delta = await deltas.get()
                if done:
                    break
                yield delta
            future.result()
        except Exception as exc:
            self.stats.failures += 1
            raise self._error(call, "streamed decode", exc) from exc
        finally:
            future.cancel()  # the consumer stopped early (or failed): abort the vLLM request

    async def close(self) -> None:
        """Shut vLLM down (its engine process) and stop its loop; idempotent."""
        if self._closed:
            return
        loop = self._loop()
        self._closed = True  # calls from now on fail

        async def shutdown() -> None:
            self._llm.shutdown()

        try:
            await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(shutdown(), loop))
        finally:
            await asyncio.to_thread(self._home.close)

    # -- vLLM itself -----------------------------------------------------------------
    @property
    def async_llm(self) -> Any:
        """The vLLM engine object (`AsyncLLM`). Use it on its own loop: `on_vllm_loop`."""
        return self._llm

    async def on_vllm_loop(self, fn: Callable[[Any], Awaitable[T]]) -> T:
        """Await `fn(async_llm)` on vLLM's loop, from any loop (e.g. `lambda llm: llm.reset_prefix_cache()`)."""

        async def call() -> T:
            return await fn(self._llm)

        return await self._on_home(call())

    # -- the KV pool (agents) ----------------------------------------------------------
    def kv_capacity_tokens(self) -> int | None:
        """The KV cache vLLM allocated at start (`num_gpu_blocks` x block size), in tokens."""
        blocks = self._llm.vllm_config.cache_config.num_gpu_blocks
        return int(blocks) * self.block_size if blocks else None

    def count_tokens(self, text: Any) -> int | None:
        """Tokens of a completion prompt (vLLM's tokenizer; None for anything but text)."""
        return len(self._llm.get_tokenizer().encode(text)) if isinstance(text, str) else None

    async def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as vLLM tokenizes a completion prompt (special tokens added)."""
        return await self._on_home(self._token_ids(text))

    # -- primitives ------------------------------------------------------------------
    async def _run_call(self, call: Call) -> Mapping[str, Any]:
        node = call.node
        if node.kind == PrimitiveKind.PARTIAL_PREFILL:
            prefix = prompt_text(call.inputs.get("prefix"), "prefix", self.name)
            salt, priority = cache_salt(node.config), call_priority(call)
            try:
                held = await self._on_home(self._warm(prefix, salt, priority))
            except Exception as exc:
                self.stats.failures += 1
                raise self._error(call, "prefix warm-up", exc) from exc
            return {"kv": KVHandle(self.name, prefix, held)}
        if node.kind in PREFILLS:
            return llm_helpers.server_cached_prefill(call, self.name)
        if node.kind in DECODES:
            request = self._decode_request(call, stream=False)
            self.stats.decodes += 1
            try:
                text = await self._on_home(self._final_text(request))
            except Exception as exc:
                self.stats.failures += 1
                raise self._error(call, "decode", exc) from exc
            return decode_outputs(node, text)
        raise TypeError(f"{self.name} runs LLM primitives, not {node.describe()}")

    async def _warm(self, prefix: str, salt: str | None, priority: int) -> tuple[int, ...]:
        """On vLLM's loop: prefill the prefix's whole cacheable blocks; the token ids held."""
        ids = await self._token_ids(prefix, salt)
        held = (len(ids) - 1) // self.block_size * self.block_size if self.prefix_caching else 0
        if held <= 0:
            return ()
        warm = tuple(int(t) for t in ids[:held])
        params = self._vllm.SamplingParams(max_tokens=1, temperature=0.0)
        async for _ in self._generate(vllm_prompt(list(warm), salt), params, priority):
            pass
        self.stats.warmups += 1
        self.stats.warm_tokens += held
        return warm

    async def _final_text(self, request: tuple[dict[str, Any], Any, int]) -> str:
        """On vLLM's loop: run a decode request to its end; its text."""
        final = None
        async for out in self._generate(*request):
            final = out
        if final is None or not final.outputs:
            raise RuntimeError("vLLM returned no output for the request")
        self.stats.decode_cached_tokens += int(getattr(final, "num_cached_tokens", None) or 0)
        return final.outputs[0].text

    async def _generate(self, prompt: dict[str, Any], params: Any, priority: int) -> AsyncIterator[Any]:
        """On vLLM's loop: one vLLM request's outputs."""
        engine_input = await self._render(prompt)
        kwargs = {"priority": priority} if self.priority_scheduling else {}
        async for out in self._llm.generate(engine_input, params, f"teola-{uuid.uuid4().hex}", **kwargs):
            yield out

    async def _render(self, prompt: dict[str, Any]) -> Any:
        """A prompt dict (text or token ids) as vLLM's engine input, tokenized as a completion prompt.

        vLLM 0.32 renders prompts through `AsyncLLM.renderer` (raw prompts to `generate` are
        deprecated there); a vLLM without it takes the prompt dict as it is.
        """
        renderer = getattr(self._llm, "renderer", None)
        if renderer is None:
            return prompt
        (engine_input,) = await renderer.render_cmpl_async([prompt])
        return engine_input

    async def _token_ids(self, text: str, salt: str | None = None) -> list[int]:
        """On vLLM's loop: the token ids vLLM runs for the prompt `text`."""
        rendered = await self._render(vllm_prompt(text, salt))
        if "prompt_token_ids" in rendered:
            return [int(t) for t in rendered["prompt_token_ids"]]
        return [int(t) for t in self._llm.get_tokenizer().encode(text)]

    def _decode_request(self, call: Call, *, stream: bool) -> tuple[dict[str, Any], Any, int]:
        """(prompt, SamplingParams, priority) of a decode call; raises naming the primitive."""
        node = call.node
        if "kv" not in call.inputs:
            raise KeyError(f"{node.describe()} has no `kv` input to decode from")
        kv = self._own(call.inputs["kv"], call)
        config = node.config
        sampling = sampling_settings(config, self._sampling_defaults)
        kind = self._output_kind
        try:
            params = self._vllm.SamplingParams(
                max_tokens=int(config.get("max_tokens", self.default_max_tokens)),
                output_kind=kind.DELTA if stream else kind.FINAL_ONLY,
                **sampling,
            )
        except Exception as exc:
            raise ValueError(f"{node.describe()}: invalid sampling settings for vLLM: {brief(exc)}") from exc
        prompt = vllm_prompt(prompt_text(kv.prompt, "kv.prompt", self.name), cache_salt(config))
        return prompt, params, call_priority(call)

    def _own(self, handle: Any, call: Call) -> KVHandle:
        return own_handle(handle, call, self.name)

    # -- vLLM's loop -----------------------------------------------------------------
    def _loop(self) -> asyncio.AbstractEventLoop:
        if self._closed:
            raise RuntimeError(f"vLLM engine {self.name!r} is closed")
        return self._home.loop

    async def _on_home(self, coro: Awaitable[T]) -> T:
        """Await a coroutine on vLLM's loop; cancelling the caller cancels it there."""
        try:
            loop = self._loop()
        except RuntimeError:
            coro.close()  # type: ignore[attr-defined]
            raise
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))  # type: ignore[arg-type]

    def _count_prefix_cache(self, queries: int, hits: int) -> None:
        self.stats.prefix_cache_queries += queries
        self.stats.prefix_cache_hits += hits

    def _error(self, call: Call, what: str, exc: BaseException) -> VLLMLocalError:
        return VLLMLocalError(
            f"{call.node.describe()}: {what} failed on in-process vLLM engine {self.name!r} "
            f"(model {self.model}): {brief(exc)}"
        )
