"""A simulated embedding engine: bag-of-words hashing vectors, profile-driven latency.

Each text's vector depends on that text alone, so embedding 48 texts in one batch or
in three stages gives bit-identical vectors. Texts that share words get similar
vectors (signed feature hashing of lower-cased words, then L2 normalisation), so a
search over them retrieves something meaningful.

    embedder = SimEmbedder(PROFILE, time_scale=0.0)
    [v] = (await embedder.run_one(call))["vectors"]   # a unit vector of `dim` floats
"""

from __future__ import annotations

import math
import re

from teola_adapters.simulated.clock import stable_hash
from teola_adapters.simulated.one_curve import OneCurveEngine
from teola_core.engines.protocol import Call, CallResult
from teola_core.ir.kinds import PrimitiveKind
from teola_core.profiles.profile import LatencyProfile

_WORD = re.compile(r"\w+")
_MEMO_LIMIT = 100_000


def words(text: str) -> list[str]:
    """Lower-cased word tokens (punctuation dropped), shared with the simulated reranker."""
    return _WORD.findall(text.lower())


class SimEmbedder(OneCurveEngine):
    """EMBED: `texts` -> `vectors`. One batch costs the profile's `embed` latency at its item total.

    dim: vector size. 64 keeps vectors small while the benchmarks' ~50-word vocabulary
    mostly lands in distinct buckets (at 32 most words would share one).
    """

    kind = PrimitiveKind.EMBED
    curve = "embed"
    items_port = "texts"

    def __init__(
        self,
        profile: LatencyProfile,
        *,
        time_scale: float = 1.0,
        dim: int = 64,
        name: str = "embedder",
        concurrency: int = 1,
    ) -> None:
        if dim < 2:
            raise ValueError(f"dim must be >= 2, got {dim}")
        super().__init__(profile, time_scale=time_scale, name=name, concurrency=concurrency)
        self.dim = dim
        self._buckets: dict[str, tuple[int, float]] = {}  # word -> (index, sign), a pure memo

    def embed(self, text: str) -> list[float]:
        """The unit vector of one text (the engine's output, without the latency)."""
        vec = [0.0] * self.dim
        for word in words(text):
            index, sign = self._bucket(word)
            vec[index] += sign
        norm = math.sqrt(sum(x * x for x in vec))
        if norm == 0.0:  # no words, or they cancelled out: still a unit vector, still deterministic
            vec[stable_hash("empty", text) % self.dim] = 1.0
            return vec
        return [x / norm for x in vec]

    def _bucket(self, word: str) -> tuple[int, float]:
        hit = self._buckets.get(word)
        if hit is None:
            h = stable_hash(word)
            hit = (h % self.dim, 1.0 if (h >> 40) & 1 else -1.0)
            if len(self._buckets) >= _MEMO_LIMIT:
                self._buckets.clear()
            self._buckets[word] = hit
        return hit

    def _one(self, call: Call) -> CallResult:
        try:
            if call.node.kind != PrimitiveKind.EMBED:
                raise TypeError(f"{self.name} runs embed primitives, not {call.node.describe()}")
            texts = call.inputs["texts"]
            if isinstance(texts, str) or not all(isinstance(t, str) for t in texts):
                raise TypeError(f"embed needs a list of strings, got {type(texts).__name__}")
            return {"vectors": [self.embed(t) for t in texts]}
        except (KeyError, TypeError) as exc:  # this call fails alone, as the protocol says
            return exc
