"""How a server guards itself: keys, limits, deadlines (`teola serve --help` names each).

ServeOptions(api_key="secret", max_concurrency=32, request_timeout_s=60)
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_STEP_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ServeOptions:
    """api_key: the bearer key every /v1 route (and /metrics unless `public_metrics`) needs.
    max_body_bytes: a larger body is a 413. max_concurrency: queries of one app that may run
    at once (None: what its engines can serve). max_queue: requests that may wait for a slot
    (None: as many as may run), each at most `queue_timeout_s`; past either, 503 with
    `Retry-After: retry_after_s`. max_lag_s: new requests are also refused while the event
    loop runs more than this far behind (see `lag`). request_timeout_s: a request's whole
    deadline (504). step_timeout_s: the apps' engine batches and user steps (None: the runtime's own, 600 s).
    """

    api_key: str | None = None
    public_metrics: bool = False
    max_body_bytes: int = 1 << 20
    max_concurrency: int | None = None
    max_queue: int | None = None
    queue_timeout_s: float = 2.0
    max_lag_s: float = 1.0
    retry_after_s: int = 1
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    step_timeout_s: float | None = DEFAULT_STEP_TIMEOUT_S

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")
        if self.max_queue is not None and self.max_queue < 0:
            raise ValueError(f"max_queue must be at least 0, got {self.max_queue}")
        for name in ("queue_timeout_s", "request_timeout_s", "max_lag_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.step_timeout_s is not None and self.step_timeout_s <= 0:
            raise ValueError(f"step_timeout_s must be > 0, got {self.step_timeout_s}")
