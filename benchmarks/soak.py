"""Soak: the default deployment under many concurrent streams for half an hour. It fails at the first
failed or hung request (the client gives up on a stream silent for 180 s) or stub crash, on a stub
whose memory or the server's shared memory climbs steadily (benchmarks/trend.py), and on shared-memory
regions left in /dev/shm once the server has stopped. Throughput is printed per wave to watch.

Waves alternate copy-heavy work (passages to summarise, code edits) with the chat sets, at 8 and 16 streams,
the cells where the `minions` stub crashed when it reached the engines through Python-backend BLS
(docs/engines.md). A stub's native crash leaves "Fatal Python error" in tritonserver's log
(faulthandler). Every stub's RSS and the size of the server's /dev/shm regions are sampled every
`--sample-s` seconds; samples from the first `--warmup-min` minutes are not judged.

    python -m benchmarks.soak [--minutes 30] [--speculation vote]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

from minions.text.datasets import chat_sets, exit_on_missing_set, load_prompts, mixed_prompts, require
from harness.triton_process import ROOT, TritonProcess

from .bench_peers import minions_request
from .trend import trend
from .workers import run_streams

WAVES = (("passages", 8), ("chat", 16), ("code_edit", 16))
CRASH_MARKS = ("Fatal Python error", "is not healthy")
MIB = 2**20


def shm_bytes(regions: set[str]) -> int:
    return sum(os.stat(f"/dev/shm/{r}").st_size for r in regions if os.path.exists(f"/dev/shm/{r}"))


class Sampler(threading.Thread):
    """Every `every` seconds: each stub's RSS and the total size of the server's /dev/shm regions."""

    def __init__(self, server: TritonProcess, every: float) -> None:
        super().__init__(daemon=True)
        self.server, self.every = server, every
        self.samples: list[dict] = []
        self.regions: set[str] = set()
        self.done = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.done.wait(self.every):
            stubs = self.server.stubs()
            self.regions |= {stub.shm_region for stub in stubs.values() if stub.shm_region}
            self.samples.append({"t": time.monotonic() - start, "rss": {k: v.rss_bytes for k, v in stubs.items()},
                                 "shm": shm_bytes(self.regions)})

    def judged(self, warmup_s: float) -> list[str]:
        """The growth verdicts for the samples after warm-up; the growing ones first."""
        after = [s for s in self.samples if s["t"] >= warmup_s]
        series = {f"{name} RSS": [s["rss"].get(name, 0) for s in after] for name in after[0]["rss"]} if after else {}
        series["/dev/shm"] = [s["shm"] for s in after]
        trends = [trend(name, values, tolerance=max(16 * MIB, 0.05 * values[0])) for name, values in series.items()]
        return [f"{t}" for t in sorted(trends, key=lambda t: not t.growing)]


def wave_prompts(workload: str, streams: int, offset: int) -> list[str]:
    """A wave's prompts: twice `streams` of the chat sets, or `streams` of a copy-heavy set, from `offset`."""
    return mixed_prompts(2 * streams, offset=offset) if workload == "chat" else load_prompts(workload, streams, offset)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--minutes", type=float, default=30.0)
    p.add_argument("--warmup-min", type=float, default=3.0)
    p.add_argument("--sample-s", type=float, default=30.0)
    p.add_argument("--speculation", default=None, help="a request's speculation (default: the deployment's)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--out", default=str(ROOT / "bench_results" / "soak"))
    return p


def main() -> None:
    args = parser().parse_args()
    require([*chat_sets(), *(w for w, _ in WAVES if w != "chat")])  # a missing set: one line, before the server
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + 60 * args.minutes
    offset, waves, requests, failures = 0, 0, 0, []
    with TritonProcess(args.deploy, log_path=out / "tritonserver.log") as server:
        sampler = Sampler(server, args.sample_s)
        sampler.start()
        request = minions_request(server.grpc_url, "minions", args.speculation, args.max_tokens)
        while time.monotonic() < deadline and not failures:
            for workload, streams in WAVES:
                prompts = wave_prompts(workload, streams, offset)
                offset = (offset + streams) % 32  # the smallest dataset's prompts, reused in turn
                tokens: list[int] = []
                wall = run_streams(prompts, streams, request, lambda _i, s: tokens.append(s.tokens),
                                   failures.append)
                waves, requests = waves + 1, requests + len(prompts)
                crashed = [m for m in CRASH_MARKS if m in server.log_text()]
                print(f"wave {waves}: {workload} x {len(prompts)} at {streams} streams, "
                      f"{sum(tokens) / wall:.1f} tok/s, {len(failures)} failed"
                      f"{', stub crash in the log' if crashed else ''}", flush=True)
                if failures or crashed:
                    failures += crashed
                    break
        sampler.done.set()
        sampler.join()
    verdicts = sampler.judged(60 * args.warmup_min) if not failures else []
    left = sorted(r for r in sampler.regions if os.path.exists(f"/dev/shm/{r}"))
    (out / "soak.json").write_text(json.dumps({"args": vars(args), "waves": waves, "requests": requests,
                                               "failures": [str(f) for f in failures], "samples": sampler.samples,
                                               "verdicts": verdicts, "shm_left": left}, indent=1))
    print("\n".join(verdicts))
    failures += [v for v in verdicts if "GROWING" in v] + [f"left in /dev/shm after the stop: {r}" for r in left]
    print(f"{waves} waves, {requests} requests in {args.minutes:g} min: "
          + (f"FAILED ({failures[0]}); see {out}" if failures else "no failure, no growth, nothing left in /dev/shm"))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    exit_on_missing_set(main)
