"""Soak: the default deployment under many concurrent streams for minutes, until a request fails or
a stub crashes. Throughput is printed per wave, but the point is the count of failures (0).

Waves alternate copy-heavy work (summarization, code_edit) with mixed chat, at 8 and 16 streams,
the cells where the `minions` stub crashed when it reached the engines through Python-backend BLS
(docs/engines.md). A stub's native crash leaves "Fatal Python error" in tritonserver's log
(faulthandler): the run stops at the first failure and prints where to read it.

    python -m benchmarks.soak [--minutes 10] [--speculation vote]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from .bench_peers import minions_request
from .datasets import load_prompts, mixed_prompts
from .server_process import ROOT, TritonProcess
from .workers import run_streams

WAVES = (("summarization", 8), ("chat", 16), ("code_edit", 16))
CRASH_MARKS = ("Fatal Python error", "is not healthy")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--speculation", default=None, help="a request's speculation (default: the deployment's)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", default=str(ROOT / "bench_results" / "soak"))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 60 * args.minutes
    offset, waves, failures = 0, 0, []
    with TritonProcess(args.deploy, log_path=out / "tritonserver.log") as server:
        request = minions_request(server.grpc_url, "minions", args.speculation, args.max_tokens)
        while time.monotonic() < deadline and not failures:
            for workload, streams in WAVES:
                prompts = (mixed_prompts(2 * streams, offset=offset) if workload == "chat"
                           else load_prompts(workload, streams, offset))
                offset = (offset + streams) % 32  # the smallest dataset's prompts, reused in turn
                tokens: list[int] = []
                wall = run_streams(prompts, streams, request, lambda _i, s: tokens.append(s.tokens),
                                   failures.append)
                waves += 1
                crashed = [m for m in CRASH_MARKS if m in server.log_text()]
                print(f"wave {waves}: {workload} x {len(prompts)} at {streams} streams, {sum(tokens) / wall:.1f} tok/s, "
                      f"{len(failures)} failed{', stub crash in the log' if crashed else ''}", flush=True)
                if failures or crashed:
                    failures += crashed
                    break
    print(f"{waves} waves in {args.minutes:g} min: "
          + (f"FAILED ({failures[0]}); see {out / 'tritonserver.log'}" if failures else "no failure"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
