"""`make loadtest`: Locust, headless, against the real server; then the summary with goodput, and a PNG.

Starts tritonserver with --deploy (unless --host names a running server, or the only protocol is
`openai`, whose users go to the OpenAI-compatible server at --openai-host: Minions' frontend or another,
e.g. llama-server), warms it with one short request per protocol, runs loadtest/locustfile.py headless
for --time s with --users closed-loop streams (spawned at --spawn-rate a second; requests under way at
the end get --stop-timeout s to finish) and writes into --out: Locust's CSV files and HTML report,
requests.jsonl (one row per request), summary.md, summary.json and loadtest.png. Exits 1 when a request
failed other than by the server refusing it as unavailable (an overload run's refusals are counted, not
failed on), when no request was recorded, or when the server it started died; 2 when a prompt set
asked for is missing (minions.text.datasets), before anything starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from client.api import GenerationParams, generate_grpc, generate_http, generate_openai
from loadtest.options import OPTIONS, add_options, option_args, prompts
from loadtest.plot import plot
from loadtest.records import read_records
from loadtest.summary import Targets, format_markdown, summarize
from minions.text.datasets import exit_on_missing_set
from harness.triton_process import ROOT, TritonProcess

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
USER_CLASSES = {"http": "HttpStreamUser", "grpc": "GrpcStreamUser", "openai": "OpenAIStreamUser"}
TRITON_PROTOCOLS = ("http", "grpc")
"""The protocols whose users go to Triton's own endpoints (the others to --openai-host)."""
RECORDS = "requests.jsonl"
"""Under --out: the rows the Locust users write, one a request."""
LOCUST_STARTUP_S = 60.0
"""Margin over run time and stop timeout before a Locust that has not exited is killed."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"), help="deployment to start the server with")
    p.add_argument("--host", help="HTTP URL of a running server (e.g. http://127.0.0.1:8000): none is started; "
                   "its gRPC address is --grpc-host")
    p.add_argument("-u", "--users", type=int, default=4, help="concurrent streams (Locust users)")
    p.add_argument("-r", "--spawn-rate", type=float, default=2.0, help="users started a second")
    p.add_argument("-t", "--time", type=int, default=30, help="seconds of load")
    p.add_argument("--stop-timeout", type=int, default=30, help="seconds the requests under way at the end may take")
    p.add_argument("--protocols", nargs="+", choices=list(USER_CLASSES), default=list(TRITON_PROTOCOLS),
                   help="user classes, sharing --users evenly (openai: the server at --openai-host)")
    p.add_argument("--ttft-target-ms", type=float, default=1000.0, help="goodput: time to first token target")
    p.add_argument("--itl-target-ms", type=float, default=50.0, help="goodput: mean inter-token latency target "
                   "(50 ms: 20 tokens/s, faster than reading)")
    p.add_argument("--out", default=str(ROOT / "bench_results" / "loadtest"), help="where the reports go")
    add_options(p, exclude=("records",))  # the runner's users write to OUT/RECORDS
    return p.parse_args(argv)


def warm_up(http_url: str, grpc_url: str, args: argparse.Namespace) -> None:
    """One short request per protocol, unrecorded: the first requests pay one-off costs. One that fails
    is printed and the run goes on (an overloaded server may refuse it; the load test counts the rest)."""
    params = GenerationParams(max_tokens=8, chat=True, speculation=args.speculation or None)
    calls = {"http": lambda: generate_http(http_url, "minions", "Hello!", params, timeout_s=args.response_timeout),
             "grpc": lambda: generate_grpc(grpc_url, "minions", "Hello!", params, timeout_s=args.response_timeout),
             "openai": lambda: generate_openai(args.openai_host, args.openai_model, "Hello!", params,
                                               timeout_s=args.response_timeout)}
    for protocol in args.protocols:
        try:
            calls[protocol]()
        except Exception as exc:  # reported; the load test itself records what the server does
            print(f"warm-up request over {protocol} failed: {exc}", file=sys.stderr)


def locust_command(args: argparse.Namespace, http_url: str, out: Path) -> list[str]:
    values = argparse.Namespace(**{**vars(args), "records": str(out / RECORDS)})
    return [sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
            "--users", str(args.users), "--spawn-rate", str(args.spawn_rate), "--run-time", f"{args.time}s",
            "--stop-timeout", str(args.stop_timeout), "--csv", str(out / "locust"),
            "--html", str(out / "locust_report.html"), "--host", http_url, *option_args(values),
            *(USER_CLASSES[p] for p in args.protocols)]


def run_locust(args: argparse.Namespace, http_url: str, out: Path) -> None:
    """Locust in its own process (it monkey-patches the standard library for gevent); exit code 1 only
    says some request failed, which the summary reports."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    timeout = args.time + args.stop_timeout + LOCUST_STARTUP_S
    rc = subprocess.run(locust_command(args, http_url, out), env=env, timeout=timeout).returncode
    if rc not in (0, 1):
        raise RuntimeError(f"locust exited with {rc}")


def settings(args: argparse.Namespace) -> dict:
    shared = {o.name: getattr(args, o.name) for o in OPTIONS if o.name not in ("records", "grpc_host")}
    return {"server": server_name(args), "users": args.users, "spawn_rate": args.spawn_rate,
            "time_s": args.time, "protocols": args.protocols, **shared}


def loads_triton(args: argparse.Namespace) -> bool:
    """Whether some users go to Triton's own endpoints (else only to --openai-host)."""
    return any(p in TRITON_PROTOCOLS for p in args.protocols)


def server_name(args: argparse.Namespace) -> str:
    """What the users load: the running server named, or the deployment started."""
    return args.host or args.deploy if loads_triton(args) else args.openai_host


def title(args: argparse.Namespace) -> str:
    return (f"Load test of {server_name(args)}: {args.users} users ({', '.join(args.protocols)}), {args.time} s, "
            f"{args.max_tokens} tokens, speculation {args.speculation or 'default'}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prompts(args)  # a missing set: one line (exit_on_missing_set), before any server starts
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / RECORDS).unlink(missing_ok=True)
    with contextlib.ExitStack() as stack:
        own = not args.host and loads_triton(args)
        server = stack.enter_context(TritonProcess(args.deploy, out / "tritonserver.log")) if own else None
        # Locust's --host is the HTTP user's; an openai-only run has none and names the OpenAI server.
        http_url, args.grpc_host = ((args.host or args.openai_host, args.grpc_host) if server is None
                                    else (server.http_url, server.grpc_url))
        warm_up(http_url, args.grpc_host, args)
        run_locust(args, http_url, out)
        server_exit_code = None if server is None else server.proc.poll()
    records = read_records(out / RECORDS)
    if not records:
        print(f"error: no request was recorded in {out / RECORDS} (Locust's own output above says why)",
              file=sys.stderr)
        return 1
    targets = Targets(args.ttft_target_ms, args.itl_target_ms)
    summary = summarize(records, targets) | {"server_exit_code": server_exit_code, "settings": settings(args)}
    text = format_markdown(summary, title(args))
    if server_exit_code is not None:
        text += f"\n**The server exited during the run** (code {server_exit_code}; see tritonserver.log).\n"
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(records, targets, out / "loadtest.png", title(args))
    print(text)
    print(f"wrote {out}/: summary.md, summary.json, loadtest.png, locust_report.html, locust_*.csv, {RECORDS}")
    return 1 if summary["failed"] > summary["unavailable"] or server_exit_code is not None else 0


if __name__ == "__main__":
    sys.exit(exit_on_missing_set(main))
