"""`python -m minions.frontend`: serve the OpenAI-compatible API for a running tritonserver.

`make serve` starts it beside tritonserver (minions/deploy/server.py) on deploy.yaml's
`server.openai_port`; started by hand it needs Triton's gRPC address and the orchestrator's name.
Its own limits are flags (FrontendSettings).
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

import uvicorn
from fastapi import FastAPI

from minions.frontend.app import create_app
from minions.frontend.settings import FrontendSettings
from minions.frontend.triton_stream import TritonStream

log = logging.getLogger("minions.frontend")


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="OpenAI-compatible API in front of the Minions Triton server")
    parser.add_argument("--grpc-url", default="127.0.0.1:8001", help="tritonserver's gRPC endpoint")
    parser.add_argument("--model", default="minions", help="the orchestrator model, also the name clients send")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (0.0.0.0 serves other machines)")
    parser.add_argument("--port", type=int, default=9000)
    FrontendSettings.add_arguments(parser)
    return parser.parse_args(argv)


def build_app(args: argparse.Namespace) -> FastAPI:
    """The app for `args`. Raises ValueError for settings it cannot serve with."""
    return create_app(TritonStream(args.grpc_url, args.model), args.model, FrontendSettings.from_args(args))


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        app = build_app(args)
    except ValueError as exc:
        raise SystemExit(f"minions.frontend: {exc}") from None
    log.info("OpenAI API on http://%s:%d/v1 for %s at %s", args.host, args.port, args.model, args.grpc_url)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
