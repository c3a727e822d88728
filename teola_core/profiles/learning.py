"""Latencies learned from an app's own runs, kept as profiles the passes plan with.

Every observation is `(key, op, x, seconds)`: a key names what ran (an engine, as
`"embed:OpenAIEmbeddings"`, or a step of the app, as the framework adapter names it),
`op` the operation (`"embed"`, `"search"`, `"run"` for a step's whole run) and `x` the
batch size or tokens. Samples are bucketed by x in powers of two and the last `window`
of each bucket kept, so the figures follow the app as it changes; a curve point is the
bucket's median x and median seconds (a single slow run does not move it). Counts (how
many items a list-writing step produced) and words (how long a text-writing step's text
was: how much of a prompt it fills) are kept the same way.

    book = LatencyBook()
    book.observe("step:retriever", "run", 1, 0.31)
    book.profiles(min_samples=1)["step:retriever"].latency("run", 1)   # 0.31
    book.count("step:parser")                                          # None: never seen
    book.observe_words("step:document", 1180); book.words(min_samples=1)  # {"step:document": 1180}
    book.save("app.json"); LatencyBook.load("app.json")

A book is thread-safe: framework callbacks report from worker threads and event loops.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import threading
from collections import deque
from collections.abc import Mapping
from pathlib import Path

from teola_core.profiles.profile import Curve, LatencyProfile

FORMAT = "teola-learned-profiles/1"


def _bucket(x: float) -> int:
    return math.floor(math.log2(x)) if x >= 1 else 0


class LatencyBook:
    """Observed latencies and counts (see the module docstring)."""

    def __init__(self, window: int = 32) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        self.window = window
        self._lock = threading.Lock()
        self._samples: dict[tuple[str, str], dict[int, deque[tuple[float, float]]]] = {}
        self._counts: dict[str, deque[int]] = {}
        self._words: dict[str, deque[int]] = {}
        self.calls = 0  # whole calls of the app observed (see `call_done`)
        self.version = 0  # grows with every observation: whether anything is new since a look

    def observe(self, key: str, op: str, x: float, seconds: float) -> None:
        """One run of `op` on `key` took `seconds` for `x` items (or tokens)."""
        if x <= 0 or seconds < 0 or not math.isfinite(seconds):
            return
        with self._lock:
            self.version += 1
            buckets = self._samples.setdefault((key, op), {})
            buckets.setdefault(_bucket(x), deque(maxlen=self.window)).append((float(x), float(seconds)))

    def observe_count(self, key: str, n: int) -> None:
        """`key` produced `n` items this time."""
        self._tally(self._counts, key, n)

    def observe_words(self, key: str, n: int) -> None:
        """`key` wrote a text of `n` words this time."""
        self._tally(self._words, key, n)

    def _tally(self, store: dict[str, deque[int]], key: str, n: int) -> None:
        with self._lock:
            self.version += 1
            store.setdefault(key, deque(maxlen=self.window)).append(int(n))

    def call_done(self) -> int:
        """One whole call of the app finished; returns how many have."""
        with self._lock:
            self.calls += 1
            return self.calls

    def samples(self, key: str, op: str) -> int:
        with self._lock:
            return sum(len(b) for b in self._samples.get((key, op), {}).values())

    def profiles(self, min_samples: int = 3) -> dict[str, LatencyProfile]:
        """A profile per key, with a curve per op that has at least `min_samples` samples."""
        with self._lock:
            items = [(k, {b: list(d) for b, d in buckets.items()}) for k, buckets in self._samples.items()]
        curves: dict[str, dict[str, Curve]] = {}
        for (key, op), buckets in items:
            if sum(len(s) for s in buckets.values()) < min_samples:
                continue
            points = tuple(
                (statistics.median(x for x, _ in s), statistics.median(t for _, t in s))
                for _, s in sorted(buckets.items())
            )
            curves.setdefault(key, {})[op] = Curve(points)
        return {key: LatencyProfile(key, c) for key, c in curves.items()}

    def count(self, key: str, min_samples: int = 3) -> int | None:
        """How many items `key` usually produces (the median, rounded down), once seen `min_samples` times."""
        return self._typical(self._counts, min_samples).get(key)

    def counts(self, min_samples: int = 3) -> dict[str, int]:
        return self._typical(self._counts, min_samples)

    def words(self, min_samples: int = 3) -> dict[str, int]:
        """How many words each text-writing key usually writes (the median, rounded down)."""
        return self._typical(self._words, min_samples)

    def _typical(self, store: dict[str, deque[int]], min_samples: int) -> dict[str, int]:
        with self._lock:
            seen = {key: list(d) for key, d in store.items()}
        return {key: int(statistics.median_low(v)) for key, v in seen.items() if len(v) >= min_samples}

    # -- files -----------------------------------------------------------------------
    def to_json(self) -> dict[str, object]:
        with self._lock:
            samples = [
                {"key": key, "op": op, "samples": [list(p) for d in buckets.values() for p in d]}
                for (key, op), buckets in self._samples.items()
            ]
            counts = {key: list(d) for key, d in self._counts.items()}
            words = {key: list(d) for key, d in self._words.items()}
            calls = self.calls
        return {"format": FORMAT, "calls": calls, "latencies": samples, "counts": counts, "words": words}

    @classmethod
    def from_json(cls, data: Mapping[str, object], window: int = 32) -> LatencyBook:
        if data.get("format") != FORMAT:
            raise ValueError(f"not a file of learned profiles (format {data.get('format')!r}, expected {FORMAT!r})")
        book = cls(window)
        latencies = data.get("latencies", [])
        counts = data.get("counts", {})
        words = data.get("words", {})  # absent in files written before words were learned
        assert isinstance(latencies, list) and isinstance(counts, Mapping) and isinstance(words, Mapping)
        for entry in latencies:
            for x, seconds in entry["samples"]:
                book.observe(str(entry["key"]), str(entry["op"]), x, seconds)
        for key, values in counts.items():
            for n in values:
                book.observe_count(str(key), int(n))
        for key, values in words.items():
            for n in values:
                book.observe_words(str(key), int(n))
        calls = data.get("calls", 0)
        book.calls = int(calls) if isinstance(calls, int) else 0
        return book

    def save(self, path: str | Path) -> None:
        """Write the book as JSON, atomically (a reader never sees half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_json(), indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: str | Path, window: int = 32) -> LatencyBook:
        try:
            data = json.loads(Path(path).read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not a file of learned profiles ({exc})") from exc
        return cls.from_json(data, window)


def merged(given: Mapping[str, LatencyProfile], learned: Mapping[str, LatencyProfile]) -> dict[str, LatencyProfile]:
    """`given` with learned curves filling in what it lacks (a given curve always wins)."""
    out = dict(given)
    for key, profile in learned.items():
        have = out.get(key)
        if have is None:
            out[key] = profile
            continue
        extra = {op: c for op, c in profile.curves.items() if op not in have.curves}
        if extra:
            out[key] = LatencyProfile(have.engine, {**have.curves, **extra})
    return out


def differs(
    old: Mapping[str, LatencyProfile],
    new: Mapping[str, LatencyProfile],
    tolerance: float = 0.25,
    floor_s: float = 0.002,
) -> bool:
    """Whether `new` tells a planner something `old` did not: a new key or op, or a latency
    (at the first point of a curve, and at x=1) that moved by more than `tolerance` (and `floor_s`)."""
    for key, profile in new.items():
        before = old.get(key)
        if before is None:
            return True
        for op, curve in profile.curves.items():
            if op not in before.curves:
                return True
            for x in {1.0, curve.points[0][0], curve.points[-1][0]}:
                a, b = before.curves[op].latency(x), curve.latency(x)
                if abs(a - b) > max(floor_s, tolerance * max(a, b)):
                    return True
    return False


def words_differ(old: Mapping[str, int], new: Mapping[str, int], tolerance: float = 0.25) -> bool:
    """Whether a text's typical length is new or moved by more than `tolerance` (a plan that
    weighed it, prefill split's, may then change)."""
    return any(key not in old or abs(n - old[key]) > tolerance * max(old[key], 1) for key, n in new.items())
