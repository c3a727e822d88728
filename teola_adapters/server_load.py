"""A model server's load as its `/metrics` report it, read when Teola needs it (no polling loop).

    watch = ServerWatch("http://127.0.0.1:8000")
    reading = await watch.read()     # ServerReading(running=16, waiting=3, kv_usage=0.4), or
                                     # None: the server has no vLLM gauges (not vLLM-like)

vLLM (and the simulated vLLM-like server) report `vllm:num_requests_running`,
`vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`, one sample per model label;
they are summed, `vllm:cache_config_info` gives the KV cache's size (`kv_tokens`), and
the sums of three request histograms what its work costs (`ServerCosts`).
Servers without them (another OpenAI-compatible server, a `/metrics`
that 404s) are not vLLM-like: Teola then never holds their calls. `ServerCalls` keeps
one server's count of calls and its learned limit (`teola_core.scheduler.server_limit`),
and asks for a reading when the answer could change the limit: at most one read in
flight, one per 20 ms while learning and one per 250 ms once the server's capacity is
known, each interval doubling (up to 2 s) after every read that taught nothing, so a
busy server is not read over and over for the same answer.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable
from typing import Any

from teola_adapters._optional import require
from teola_core.engines.protocol import EngineControls
from teola_core.scheduler.server_costs import COST_SUMS, TOKEN_GAP_BUCKETS, ServerCosts
from teola_core.scheduler.server_limit import ServerLimit, ServerReading

RUNNING, WAITING, KV_USAGE = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
SERIES = (RUNNING, WAITING, KV_USAGE, *COST_SUMS)  # summed over labels
GAUGES = (*(f"{name}{end}" for name in SERIES for end in ("{", " ")), f"{CACHE_CONFIG}{{", f"{TOKEN_GAP_BUCKETS}{{")
READ_TIMEOUT_S = 2.0
LEARNING_INTERVAL_S = 0.02  # between reads while the server's capacity is not known yet
KNOWN_INTERVAL_S = 0.25  # once it is: reads only catch a change (room gained, other clients)
MAX_INTERVAL_S = 2.0  # the interval doubles after each read that taught nothing, up to this


class MetricsUnreadable(RuntimeError):
    """A server's `/metrics` could not be read or parsed (the message names the server)."""


def parse_reading(text: str) -> ServerReading | None:
    """The load gauges (and cost sums) of a Prometheus text page; None without vLLM's
    running/waiting gauges."""
    parser = require("prometheus_client.parser", "langchain", "Reading a model server's /metrics")
    # vLLM's page is long (histograms per model): only the gauges' lines are parsed
    lines = "\n".join(line for line in text.splitlines() if line.startswith(GAUGES))
    sums: dict[str, float] = {}
    gap_buckets: dict[float, float] | None = {}  # upper bound -> cumulative count, summed over engines
    kv_tokens: int | None = None
    for family in parser.text_string_to_metric_families(lines + "\n"):
        if family.name in SERIES:
            sums[family.name] = sums.get(family.name, 0.0) + sum(sample.value for sample in family.samples)
        elif family.name == TOKEN_GAP_BUCKETS and gap_buckets is not None:
            for sample in family.samples:
                bound = bucket_bound(sample.labels)
                if bound is None:  # not a histogram Teola can read: its costs stay unknown, the load is read
                    gap_buckets = None
                    break
                gap_buckets[bound] = gap_buckets.get(bound, 0.0) + sample.value
        elif family.name == CACHE_CONFIG:
            sizes = [kv_pool_tokens(sample.labels) for sample in family.samples]
            known = [size for size in sizes if size is not None]
            kv_tokens = sum(known) if known and len(known) == len(sizes) else None
    if RUNNING not in sums or WAITING not in sums:
        return None
    costs = ServerCosts.from_series(sums, gap_buckets) if gap_buckets is not None else None
    return ServerReading(int(sums[RUNNING]), int(sums[WAITING]), sums.get(KV_USAGE), kv_tokens, costs)


def bucket_bound(labels: dict[str, str]) -> float | None:
    """A histogram bucket's upper bound (`le`, "+Inf" included); None if it has none."""
    try:
        return float(labels["le"])
    except (KeyError, ValueError):
        return None


def kv_pool_tokens(labels: dict[str, str]) -> int | None:
    """A vLLM engine's KV cache in tokens, from `cache_config_info`'s labels (`num_gpu_blocks`
    blocks of `block_size` tokens); None where they are missing (before the engine sized
    its cache vLLM reports `num_gpu_blocks="None"`)."""
    try:
        return int(labels["num_gpu_blocks"]) * int(labels["block_size"])
    except (KeyError, ValueError):
        return None


def root_of(base_url: str) -> str:
    """The server root of an OpenAI-compatible base URL (`http://host:8000/v1` -> `http://host:8000`)."""
    root = base_url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root


class ServerWatch:
    """Reads one server's `/metrics` over one kept-alive client, made on the first read (on
    the reading loop: the watch belongs to one event loop) and closed by `aclose`. Making a
    client costs tens of milliseconds of CPU (its TLS context), far more than a read."""

    def __init__(self, root_url: str, timeout: float = READ_TIMEOUT_S) -> None:
        self.root_url = root_url
        self.timeout = timeout
        self._client: Any = None

    async def read(self) -> ServerReading | None:
        """The server's load now; None if it reports none; `MetricsUnreadable` if the read failed."""
        httpx = require("httpx", "langchain", "Reading a model server's /metrics")
        if self._client is None:
            self._client = httpx.AsyncClient(base_url=self.root_url, timeout=self.timeout)
        try:
            response = await self._client.get("/metrics")
            if response.status_code == 404:
                return None
            response.raise_for_status()
            return parse_reading(response.text)
        except (httpx.HTTPError, httpx.InvalidURL, ValueError) as exc:
            raise MetricsUnreadable(f"{self.root_url}/metrics: {exc!r}") from exc

    async def aclose(self) -> None:
        """Close the kept-alive client (a later read opens another)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class ServerLoadWatch:
    """An engine's `load_watch` (`teola_core.engines.protocol.LoadWatch`) for a model on an
    OpenAI-compatible server: per runtime it attaches to, a `ServerCalls` that sees the
    engine's queue and sets its concurrency, closed with the runtime."""

    def __init__(self, root_url: str) -> None:
        self.root_url = root_url
        self.attached: weakref.WeakSet[ServerCalls] = weakref.WeakSet()  # one per live runtime (event loop)

    def attach(self, runtime: EngineControls, engine: str) -> None:
        calls = ServerCalls(ServerWatch(self.root_url), lambda n: runtime.set_concurrency(engine, n))
        runtime.watch_engine(engine, calls.watcher(engine))
        runtime.on_close(calls.aclose)
        self.attached.add(calls)


class ServerFoundLater:
    """A load watch for an engine whose server is known only from its first call (an
    agent's model, which the compiled agent holds out of reach): runtimes attach as usual,
    and `found(root_url)` starts a `ServerLoadWatch` on each of them (the first server
    found is the one watched; calls before it go at once, as before any reading)."""

    def __init__(self) -> None:
        self.watch: ServerLoadWatch | None = None
        self._waiting: list[tuple[weakref.ref[EngineControls], str]] = []

    @property
    def attached(self) -> list[ServerCalls]:
        """As `ServerLoadWatch.attached` (none before the server is found)."""
        return [] if self.watch is None else list(self.watch.attached)

    def attach(self, runtime: EngineControls, engine: str) -> None:
        if self.watch is not None:
            self.watch.attach(runtime, engine)
        else:
            self._waiting.append((weakref.ref(runtime), engine))

    def found(self, root_url: str) -> None:
        if self.watch is not None:
            return
        self.watch = ServerLoadWatch(root_url)
        waiting, self._waiting = self._waiting, []
        for ref, engine in waiting:
            runtime = ref()
            if runtime is not None:
                self.watch.attach(runtime, engine)


def reported_kv_tokens(watch: ServerLoadWatch | ServerFoundLater | None) -> int | None:
    """The KV cache size a watched server reported (None before a reading, or where it does not say)."""
    attached = watch.attached if watch is not None else ()
    return next((c.last.kv_tokens for c in attached if c.last is not None and c.last.kv_tokens), None)


class ServerCalls:
    """One server's model calls on one event loop: in flight, held, and the learned limit.

    `vllm` is None until the first reading (calls go at once meanwhile), then whether the
    server reports its load; `on_limit(n)` is called when it is found vLLM-like and when
    the limit changes. A read that fails is kept in `error`: before any good read the
    server is treated as not vLLM-like (calls go at once), after one the bound stays.
    """

    def __init__(self, watch: ServerWatch, on_limit: Callable[[int], None]) -> None:
        self.watch = watch
        self.limit = ServerLimit()
        self.on_limit = on_limit
        self.vllm: bool | None = None
        self.error: BaseException | None = None
        self.in_flight = 0
        self.held = 0
        self.held_total = 0
        self.last: ServerReading | None = None
        self._reading: asyncio.Task[None] | None = None
        self._again = False
        self._next_read = 0.0
        self._idle_reads = 0  # reads in a row that taught nothing
        self._by_engine: dict[str, tuple[int, int]] = {}
        self._closed = False

    # -- calls -----------------------------------------------------------------------------
    def watcher(self, engine: str) -> Callable[[int, int], None]:
        """The `watch_engine` watcher of one engine on this server: the server's counts are
        the sum over its engines (each engine is still given the whole limit)."""

        def counts(in_flight: int, held: int) -> None:
            self._by_engine[engine] = (in_flight, held)
            self.counts(sum(f for f, _ in self._by_engine.values()), sum(h for _, h in self._by_engine.values()))

        return counts

    def counts(self, in_flight: int, held: int) -> None:
        """The server's calls changed: `in_flight` sent, `held` waiting in Teola. Reads the
        server at first use, then when a reading could change the limit
        (`ServerLimit.worth_reading`)."""
        if held > self.held:
            self.held_total += held - self.held
        self.in_flight, self.held = in_flight, held
        if self.vllm is None or self.limit.worth_reading(in_flight, held):
            self.want_reading()

    # -- readings --------------------------------------------------------------------------
    def want_reading(self) -> None:
        """Read the server soon: now if no read is in flight and the last is old enough."""
        if self.vllm is False or self._closed:
            return
        if self._reading is not None:
            self._again = True
            return
        loop = asyncio.get_running_loop()
        delay = self._next_read - loop.time()
        self._reading = loop.create_task(self._read(max(0.0, delay)))

    async def _read(self, delay: float) -> None:
        cancelled = False
        try:
            if delay:
                await asyncio.sleep(delay)  # the read interval's bound, not a poll: one read is owed
            in_flight = self.in_flight
            try:
                reading = await self.watch.read()
            except Exception as exc:  # kept in `error`, shown by explain(); never fails a call
                self.error = exc
                if not self.vllm:  # never read: not a server Teola can read, calls go at once
                    self.vllm = False
                else:  # it was read before: keep what was learned, read again later
                    self._idle_reads += 1
                return
            self.error = None
            if reading is None:
                self.vllm = False
            else:
                if not self.vllm:
                    self.vllm = True
                    self.on_limit(self.limit.limit)  # a vLLM-like server: its calls are bounded from now on
                self.last = reading
                before = self.limit.state
                after = self.limit.observe(reading, in_flight=in_flight, holding=self.held > 0)
                if after != before[0]:
                    self.on_limit(after)
                self._idle_reads = 0 if self.limit.state != before else self._idle_reads + 1
        except asyncio.CancelledError:
            cancelled = True
            raise
        finally:
            self._reading = None
            base = LEARNING_INTERVAL_S if self.limit.capacity is None else KNOWN_INTERVAL_S
            interval = min(MAX_INTERVAL_S, base * 2 ** min(self._idle_reads, 10))
            self._next_read = asyncio.get_running_loop().time() + interval
            if not cancelled and self._again and self.vllm and self.limit.worth_reading(self.in_flight, self.held):
                self._again = False
                self.want_reading()
            self._again = False

    async def settled(self) -> None:
        """Return once no reading is in flight (what is known then stays until the next call)."""
        while self._reading is not None:
            await asyncio.shield(self._reading)

    def describe(self) -> str:
        """One line for `explain()`: what Teola knows about the server."""
        if self.error is not None and not self.vllm:
            return f"{self.watch.root_url}: /metrics unreadable ({self.error!r}): calls go at once"
        if self.vllm is None:
            return f"{self.watch.root_url}: not read yet"
        if not self.vllm:
            return f"{self.watch.root_url}: no vLLM load gauges in /metrics: calls go at once"
        capacity = "not seen yet" if self.limit.capacity is None else f"{self.limit.capacity} at once"
        failed = "" if self.error is None else f" (the last read failed: {self.error!r}; the bound stays)"
        return (
            f"{self.watch.root_url}: vLLM-like; runs {capacity}; Teola keeps at most {self.limit.limit} calls "
            f"there, the rest wait in Teola, earliest run first ({self.held_total} calls held so far, "
            f"{self.limit.readings} readings){failed}"
        )

    async def aclose(self) -> None:
        """Stop reading (a reading in flight is cancelled) and close the HTTP client."""
        self._closed = True
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)
        await self.watch.aclose()
