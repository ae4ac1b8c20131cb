"""`make gpu-check`: the GPU acceptance run in one command, on a lent GPU machine (docs/benchmarks.md).

First the packed forward alone (benchmarks.bench_forward_ops on CUDA: operators, kernel launches and ms
per step at 1, 8 and 16 rows with drafts of 0, 4 and 16 tokens; `off`'s ms per token at one stream is
its one-row plain cell). Then it serves deploy.cuda.yaml (SmolLM2 on torch on CUDA, fp32) and runs benchmarks.bench_load on chat prompts
and on copy-heavy ones, for the default (`minions`: vote + adaptive length + pipeline) and the suffix
drafter alone, each against `off` at 1, 8 and 16 streams, greedy, counting outputs identical to `off`'s.
bench_load gives every mode a server of its own: the adaptive length learns the LLM's costs server-wide,
so a mode measured after another would start from the lengths the first one climbed to. The suffix drafter's
corpus of finished requests is off: every mode replays the same prompts, so a corpus would hold the
answers `off` just gave. Writes report.md (the machine, the versions, every table) under --out, and
exits non-zero if a sweep failed or any speculative output differed from `off`'s.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from minions.deploy.config import ROOT
from minions.text.datasets import DEFAULT_COPY_HEAVY

from .replay import replay_deployment

SWEEPS = {"chat": [], "copy_heavy": list(DEFAULT_COPY_HEAVY)}
"""Sweep name -> bench_load --datasets (none: the chat sets, mixed)."""

MODES = ["minions", "single:ssm_suffix"]
"""The speculative modes, measured against `off` (bench_load adds it)."""


def machine() -> str:
    """What ran it: the GPU, the driver, and the versions that matter."""
    lines = [f"- python {platform.python_version()}, {platform.machine()}"]
    try:
        gpus = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        lines.append(f"- GPU: {gpus or 'none reported'}")
    except (OSError, subprocess.TimeoutExpired) as exc:
        lines.append(f"- GPU: nvidia-smi failed ({exc})")
    for name in ("torch", "transformers", "numpy", "tritonclient", "nvidia-pytriton"):
        try:
            lines.append(f"- {name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            lines.append(f"- {name}: not installed")
    return "\n".join(lines)


def sweep(name: str, datasets: list[str], deploy: Path, out: Path, args: argparse.Namespace) -> tuple[int, Path]:
    """One bench_load run of MODES and `off`; its output goes to the console and to <out>/<name>/bench_load.log."""
    target = out / name
    target.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.bench_load", "--deploy", str(deploy), "--streams", *map(str, args.streams),
           "--modes", *MODES, "--max-tokens", str(args.max_tokens), "--min-requests", str(args.min_requests),
           "--out", str(target), *(["--datasets", *datasets] if datasets else [])]
    print(f"== {name}: {' '.join(cmd)}", flush=True)
    with open(target / "bench_load.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in proc.stdout:
            print(line, end="", flush=True)
            log.write(line)
    return proc.wait(), target


def forward_ops(deploy: str, out: Path) -> tuple[int, Path]:
    """bench_forward_ops on CUDA in a process of its own (its GPU memory is freed before the servers start)."""
    target = out / "forward_ops"
    cmd = [sys.executable, "-m", "benchmarks.bench_forward_ops", "--deploy", deploy, "--device", "cuda",
           "--out", str(target)]
    print(f"== forward ops: {' '.join(cmd)}", flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode, target / "forward_ops.md"


def mismatches(target: Path) -> list[str]:
    """Cells whose outputs were not all identical to `off`'s (a near tie flipped, or a bug)."""
    path = target / "load_sweep.json"
    if not path.exists():
        return [f"{target.name}: no results"]
    rows = json.loads(path.read_text())["rows"]
    return [f"{target.name} {r['mode']} @{r['streams']}: {r['identical_to_off']}/{r['requests']} identical"
            for r in rows if r["identical_to_off"] != r["requests"]]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.cuda.yaml"))
    p.add_argument("--out", default=str(ROOT / "bench_results" / "gpu-check"))
    p.add_argument("--streams", nargs="+", type=int, default=[1, 8, 16])
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--min-requests", type=int, default=8)
    p.add_argument("--sweeps", nargs="+", choices=list(SWEEPS), default=list(SWEEPS))
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deploy = replay_deployment(Path(args.deploy), out / "deploy.yaml")  # each mode has its own server
    report = ["# GPU check", "", machine(), "", f"Deployment: {args.deploy}, suffix corpus off ({deploy} here).", ""]
    failures: list[str] = []
    code, table = forward_ops(args.deploy, out)
    report += ["## Packed forward, per step", "",
               table.read_text() if table.exists() else f"(no table: bench_forward_ops exited {code})", ""]
    failures += [f"forward ops: bench_forward_ops exited {code}"] if code else []
    for name in args.sweeps:
        code, target = sweep(name, SWEEPS[name], deploy, out, args)
        table = target / "load_sweep.md"
        report += [f"## {name} ({', '.join(SWEEPS[name]) or 'chat sets, mixed'})", "",
                   table.read_text() if table.exists() else f"(no table: bench_load exited {code})", ""]
        failures += [f"{name}: bench_load exited {code}"] if code else []
        failures += mismatches(target)
        (out / "report.md").write_text("\n".join(report + ["## Failures", *failures] if failures else report) + "\n")
    print("\n".join(["", *failures]) if failures else "\nall speculative outputs identical to off", flush=True)
    print(f"wrote {out / 'report.md'}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
