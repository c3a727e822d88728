"""`teola serve module:app [name=module:app ...]`: the OpenAI-compatible server."""

from __future__ import annotations

import argparse
import os
from typing import Any

# As teola.server.options's; not imported: `teola --help` must work without the serve extra.
DEFAULT_MAX_BODY_BYTES = 1 << 20
DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_STEP_TIMEOUT_S = 120.0
DEFAULT_QUEUE_TIMEOUT_S = 2.0


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        value = kind(text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        return value

    return parse


def add_serve_command(commands: Any) -> None:
    p: argparse.ArgumentParser = commands.add_parser(
        "serve",
        help="serve LangChain and LlamaIndex apps behind an OpenAI-compatible API",
        description="Serve apps behind an OpenAI-compatible API (/v1/chat/completions, /v1/completions, "
        "/v1/models, /health, /metrics). Each app is module:attr (served as attr) or name=module:attr, "
        "imported from the working directory first.",
    )
    p.add_argument("apps", nargs="+", metavar="[name=]module:app")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("TEOLA_API_KEY"),
        help="bearer key every /v1 route and /metrics require (default: $TEOLA_API_KEY; none: open)",
    )
    p.add_argument("--public-metrics", action="store_true", help="serve /metrics without the API key")
    p.add_argument(
        "--backend", default="local", choices=["local", "reference", "ray"], help="runtime (default: %(default)s)"
    )
    p.add_argument(
        "--ray-address",
        default=None,
        help="with --backend ray: the Ray cluster to join ('auto', 'ray://head:10001'; default: $RAY_ADDRESS, "
        "else a new local cluster)",
    )
    p.add_argument(
        "--max-body-bytes",
        type=_positive(int),
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body; larger is a 413 (default: %(default)s)",
    )
    p.add_argument(
        "--max-concurrency",
        type=_positive(int),
        default=None,
        help="the most queries of one app running at once; fewer while the server's own CPU cannot keep up "
        "(default: what the app's busiest engine serves at once, concurrency x max batch; 64 without engines)",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="requests of one app that may wait for a free slot; more are refused with 503 + Retry-After "
        "(default: as many as --max-concurrency)",
    )
    p.add_argument(
        "--queue-timeout",
        type=_positive(float),
        default=DEFAULT_QUEUE_TIMEOUT_S,
        help="seconds a request may wait for a slot before a 503 (default: %(default)s)",
    )
    p.add_argument(
        "--request-timeout",
        type=_positive(float),
        default=DEFAULT_REQUEST_TIMEOUT_S,
        help="seconds a whole request may take (body, wait, run, stream); past it: 504, query cancelled "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=_positive(float),
        default=DEFAULT_STEP_TIMEOUT_S,
        help="seconds one engine batch or user step may run; past it the query fails with a TimeoutError "
        "naming the step (default: %(default)s)",
    )
    p.add_argument(
        "--backlog",
        type=_positive(int),
        default=2048,
        help="connections the kernel holds for the server to accept; past it new connections wait or are "
        "refused before they cost the server anything (default: %(default)s)",
    )
    p.add_argument("--log-level", default="info", help="uvicorn's log level (default: %(default)s)")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.ray_address is not None and args.backend != "ray":
        raise SystemExit("teola serve: --ray-address needs --backend ray")
    try:
        from teola.server.app_loading import AppSpecError
        from teola.server.options import ServeOptions
        from teola.server.runner import serve
    except ModuleNotFoundError as exc:
        raise SystemExit(f"teola serve needs {exc.name}: pip install 'teola[serve]'") from exc
    try:
        options = ServeOptions(
            api_key=args.api_key,
            public_metrics=args.public_metrics,
            max_body_bytes=args.max_body_bytes,
            max_concurrency=args.max_concurrency,
            max_queue=args.max_queue,
            queue_timeout_s=args.queue_timeout,
            request_timeout_s=args.request_timeout,
            step_timeout_s=args.timeout,
        )
        serve(
            args.apps,
            host=args.host,
            port=args.port,
            backend=args.backend,
            ray_address=args.ray_address,
            log_level=args.log_level,
            backlog=args.backlog,
            options=options,
        )
    except (AppSpecError, ValueError) as exc:
        raise SystemExit(f"teola serve: {exc}") from None
    return 0
