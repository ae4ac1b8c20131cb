"""`python -m minions.frontend`: serve the OpenAI-compatible API for a running tritonserver.

`make serve` starts it beside tritonserver (minions/deploy/server.py) on deploy.yaml's
`server.openai_port`; started by hand it needs Triton's gRPC address and the orchestrator's name, and
on tritonserver's host its model repository, to end the generations a dead orchestrator stub leaves
unanswered (orphans.py).
Its own limits are flags (FrontendSettings); the API key comes from the environment (auth.py).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from minions.frontend.app import create_app
from minions.frontend.auth import API_KEY_ENV, API_KEY_FILE_ENV, api_key_from
from minions.frontend.health import ReplicaHealth
from minions.frontend.orphans import OrphanWatch
from minions.frontend.settings import FrontendSettings
from minions.frontend.triton_stream import TritonStream
from minions.triton.stubs import boot_clock, stub_start_times

log = logging.getLogger("minions.frontend")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="OpenAI-compatible API in front of the Minions Triton server",
                                     epilog=f"API key: set {API_KEY_ENV}, or {API_KEY_FILE_ENV} to a file holding "
                                            "it, to require 'Authorization: Bearer <key>' on /v1")
    parser.add_argument("--grpc-url", default="127.0.0.1:8001", help="tritonserver's gRPC endpoint")
    parser.add_argument("--model", default="minions", help="the orchestrator model, also the name clients send")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 serves other machines)")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--model-repository", type=Path, default=None,
                        help="tritonserver's model repository, on this host: with it, a generation the "
                             "orchestrator's stub leaves unanswered when it dies ends with 503 (Triton 2.51 "
                             "never answers it), and /health answers 503 while its stub is dead")
    parser.add_argument("--metrics-url", default=None,
                        help="tritonserver's metrics (http://host:8002/metrics): with --model-repository, /health "
                             "answers 503 while the orchestrator refuses requests (its LLM not ready or reloading)")
    FrontendSettings.add_arguments(parser)
    return parser.parse_args(argv)


def build_app(args: argparse.Namespace, environ: Mapping[str, str]) -> FastAPI:
    """The app for `args`, with the API key `environ` holds; logs whether one is required (never the key).
    Raises ValueError for settings or a key it cannot serve with."""
    settings = FrontendSettings.from_args(args)
    key = api_key_from(environ)
    if key is None:
        log.info("API key: none required (set %s or %s to require one)", API_KEY_ENV, API_KEY_FILE_ENV)
    else:
        log.info("API key: required on /v1, from %s", key[1])
    orphans = None
    if args.model_repository is not None:
        model_dir = args.model_repository / args.model
        if not model_dir.is_dir():
            raise ValueError(f"--model-repository: {args.model_repository} has no folder for the model {args.model!r}")
        orphans = OrphanWatch(lambda: stub_start_times(model_dir), boot_clock)
    triton = TritonStream(args.grpc_url, args.model, orphans)
    health = ReplicaHealth(triton, args.model_repository, args.metrics_url)  # the URL counts with a repository only
    return create_app(triton, args.model, settings=settings, api_key=key[0] if key else None, health=health)


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = build_app(args, os.environ)
    except ValueError as exc:
        raise SystemExit(f"minions.frontend: {exc}") from None
    log.info("OpenAI API on http://%s:%d/v1 for %s at %s", args.host, args.port, args.model, args.grpc_url)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
