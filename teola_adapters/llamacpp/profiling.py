"""Measure a llama.cpp engine's latency profile: `prefill` over tokens, `decode` over sequences.

    profile = await measure_profile(llm, save_to="llamacpp.json")   # both curves, through calls (~1 min)
    curve = await calibrate_decode(llm)                              # the decode curve only, ~2 s

prefill(n): seconds for one PREFILL of a fresh n-token prompt (nothing reused), state save
included — what the scheduler pays for it. decode(n): seconds of one decode step with n
sequences. The engine batches the n decodes of one `run` (one `llama_decode` a step), so
a step is measured as (time of n decodes of k+1 tokens - time of n decodes of 1 token) / k;
n is at most the engine's `max_sequences` (more would wait for a sequence, not share steps).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from pathlib import Path

from teola_adapters.llamacpp.engine import LlamaCppEngine
from teola_core.engines.protocol import Call
from teola_core.ir.kinds import PortSpec, PrimitiveKind, spec_of
from teola_core.ir.node import Node
from teola_core.ir.types import PortType
from teola_core.profiles.profile import Curve, LatencyProfile
from teola_core.profiles.profiler import measure

_WORDS = ("apple", "river", "stone", "cloud", "amber", "forest", "harbor", "signal", "meadow", "lantern")


def _node(kind: PrimitiveKind, engine: str, **config: object) -> Node:
    spec = spec_of(kind)
    outputs = spec.outputs if spec.outputs is not None else (PortSpec("text", PortType.TEXT),)
    assert spec.inputs is not None
    return Node(f"profile.{kind.value}", kind, spec.inputs, outputs, engine=engine, config=config, caps=spec.caps)


def prompt_of_tokens(engine: LlamaCppEngine, n: int, salt: int) -> str:
    """A prompt of exactly n tokens whose first token differs with `salt` (so nothing is reused)."""
    words = [f"{salt}"] + [_WORDS[(salt + i * 5) % len(_WORDS)] for i in range(2 * n + 8)]
    tokens = engine.tokenize(" ".join(words))
    while len(tokens) < n:
        tokens = tokens + tokens
    text = engine.llm.detokenize(tokens[:n]).decode("utf-8", errors="ignore")
    return text


async def measure_profile(
    engine: LlamaCppEngine,
    prefill_tokens: Sequence[int] = (16, 32, 64, 128, 256, 512),
    decode_sequences: Sequence[int] = (1, 2, 4),
    decode_steps: int = 16,
    repeats: int = 3,
    save_to: str | Path | None = None,
) -> LatencyProfile:
    """Measure both curves on the engine, install the profile on it and return it."""
    if max(decode_sequences, default=1) > engine.max_sequences:
        raise ValueError(
            f"decode_sequences {tuple(decode_sequences)}: the engine runs at most {engine.max_sequences} at once"
        )
    prefill = _node(PrimitiveKind.PREFILL, engine.name)
    salt = int(time.time() * 1000) % 100_000
    points: list[tuple[float, float]] = []
    await measure(engine, [Call("profile", prefill, {"prompt": prompt_of_tokens(engine, 16, salt)})])  # warm-up
    for n in prefill_tokens:
        samples = []
        for _ in range(repeats):
            salt += 1
            prompt = prompt_of_tokens(engine, n, salt)
            samples.append(await measure(engine, [Call("profile", prefill, {"prompt": prompt})]))
        points.append((engine.count_tokens(prompt), statistics.median(samples)))
    prefill_curve = Curve(tuple(points))

    decode_points: list[tuple[float, float]] = []
    for n in decode_sequences:
        samples = []
        for _ in range(repeats):
            per_step = []
            for steps in (1, decode_steps + 1):
                decode = _node(PrimitiveKind.DECODE, engine.name, max_tokens=steps)
                calls = []
                for _ in range(n):
                    salt += 1
                    prompt = f"{salt}. Count from one to one hundred in words: one, two, three,"
                    kv = (await engine.run_one(Call("profile", prefill, {"prompt": prompt})))["kv"]
                    calls.append(Call("profile", decode, {"kv": kv}))
                before = engine.stats.decode_tokens
                seconds = await measure(engine, calls)
                per_step.append((seconds, engine.stats.decode_tokens - before))
            (t1, k1), (tk, kk) = per_step
            samples.append(max(0.0, (tk - t1) / max(1, kk - k1) * n))
        decode_points.append((n, statistics.median(samples)))
    curves = dict(engine.profile.curves) if engine.profile is not None else {}
    curves.update(prefill=prefill_curve, decode=Curve(tuple(decode_points)))
    profile = LatencyProfile(engine.name, curves)
    if save_to is not None:
        profile.save(save_to)
    engine.profile = profile
    return profile


async def calibrate_decode(engine: LlamaCppEngine, *, steps: int = 3, rounds: int = 5) -> Curve:
    """Measure one decode step of 1, 2, … up to max_sequences sequences now, on this machine
    and thread count; install it as the profile's `decode` curve (`max_efficient_batch`) and
    as the engine's `step_costs` (what decodes stepped by cost choose their step size from).

    Every step is timed on its own, sizes interleaved round after round, and the fastest
    step of each size counts: on a shared machine other processes only ever add time to a
    step (a preempted 7 ms step can take 30), so the minimum is the engine's own cost. The
    engine must be idle (it measures on its own sequences, then empties them).
    """
    if steps < 1 or rounds < 1:
        raise ValueError(f"steps and rounds must be >= 1, got {steps} and {rounds}")
    prompt = engine.tokenize(" ".join(_WORDS * 8))[: engine.chunk]
    top = engine.max_sequences
    sizes = list(range(1, top + 1))

    def measure() -> dict[int, float]:
        seqs, llm = engine.sequences, engine.llm
        if any(slot.busy for slot in seqs.slots):
            raise RuntimeError(f"{engine.name}: calibrate_decode needs an idle engine")
        slots = seqs.slots[:top]
        for slot in slots:
            seqs.empty(slot)
            llm.eval(slot.index, prompt, 0)
        fastest = dict.fromkeys(sizes, float("inf"))
        try:
            for _ in range(rounds):
                for n in sizes:
                    for k in range(steps):
                        began = time.perf_counter()
                        llm.step([(slot.index, prompt[-1], len(prompt) + k) for slot in slots[:n]])
                        fastest[n] = min(fastest[n], time.perf_counter() - began)
                    for slot in slots[:n]:
                        llm.truncate(slot.index, len(prompt))
        finally:
            for slot in slots:
                seqs.empty(slot)
        return fastest

    fastest = await engine.run_task(measure)
    await engine.run_task(lambda: _install(engine.step_costs, fastest))  # on the worker: it reads them
    curve = Curve(tuple(fastest.items()))
    curves = dict(engine.profile.curves) if engine.profile is not None else {}
    engine.profile = LatencyProfile(engine.name, {**curves, "decode": curve})
    return curve


def _install(costs: dict[int, float], measured: dict[int, float]) -> None:
    """Decodes stepped by cost start from these step seconds (`LlamaCppEngine.step_costs`)."""
    costs.clear()
    costs.update(measured)
