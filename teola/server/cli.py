"""`teola serve module:app [name=module:app ...]`: the OpenAI-compatible server."""

from __future__ import annotations

import argparse
import os
from typing import Any

DEFAULT_MAX_BODY_BYTES = 1 << 20  # as teola.server.app's; not imported: it needs fastapi


def add_serve_command(commands: Any) -> None:
    p: argparse.ArgumentParser = commands.add_parser(
        "serve",
        help="serve LangChain apps behind an OpenAI-compatible API",
        description="Serve apps behind an OpenAI-compatible API (/v1/chat/completions, /v1/completions, "
        "/v1/models, /health, /metrics). Each app is module:attr (served as attr) or name=module:attr.",
    )
    p.add_argument("apps", nargs="+", metavar="[name=]module:app")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--api-key", default=os.environ.get("TEOLA_API_KEY"), help="required bearer key (default: $TEOLA_API_KEY)"
    )
    p.add_argument("--backend", default="local", choices=["local", "reference", "ray"])
    p.add_argument(
        "--ray-address",
        default=None,
        help="with --backend ray: the Ray cluster to join ('auto', 'ray://head:10001'; default: $RAY_ADDRESS, "
        "else a new local cluster)",
    )
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES)
    p.add_argument("--log-level", default="info")
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    if args.ray_address is not None and args.backend != "ray":
        raise SystemExit("teola serve: --ray-address needs --backend ray")
    try:
        from teola.server.runner import serve
    except ModuleNotFoundError as exc:
        raise SystemExit(f"teola serve needs {exc.name}: pip install 'teola[serve]'") from exc
    serve(
        args.apps,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        backend=args.backend,
        max_body_bytes=args.max_body_bytes,
        log_level=args.log_level,
        ray_address=args.ray_address,
    )
    return 0
