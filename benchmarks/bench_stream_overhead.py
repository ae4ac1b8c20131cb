"""What Triton and the orchestrator add to a plain token: Minions `off` streamed through the real
server against the same llama.cpp engine streaming alone in process, at 1, 8 and 16 streams, same
prompts, lengths and settings.

`off` is one streaming engine call per request (the engine model sends its tokens over gRPC as they
are made, at most every stream interval; the orchestrator forwards each response), so the server's
cost per token is what those hops take beyond the engine's own steps. In process, the same engine's
in-flight batcher streams the same requests (same output lengths, same stream interval as the
orchestrator would ask for at that load), answered on its own thread: everything but the hops.

The server stays up while the engine runs alone (idle: it polls its repository once a second), and
each group of streams runs through the server and alone one right after the other, the order
alternating, so that a machine whose speed drifts by 10-30% within minutes (2-core cloud VMs) drifts
in both. The figure is the median over groups of their inter-token times' ratio.

    python -m benchmarks.bench_stream_overhead [--deploy deploy.yaml] [--streams 1 8 16] [--groups 2]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path

from minions.decoding.engine_call import EngineRequest, EngineResult
from minions.deploy.artifacts import tokenizer_dir_for
from minions.deploy.config import load_deployment
from minions.deploy.render import engine_settings, orchestrator_settings
from minions.engines.api import result_or_raise
from minions.engines.factory import build_engine
from minions.speculation.services import Services
from minions.text.datasets import MissingPromptSet, chat_sets, exit_on_missing_set, mixed_prompts, warm_up_prompts
from minions.text.prompt import encode_prompt
from harness.triton_process import ROOT, TritonProcess

from .bench_peers import MINIONS_OFF, minions_request
from .peers.streams import Cell, Sample, run_cell

PROMPT_OFFSET = 8
"""Past the prompts the greedy-equality test and the load sweep's first cells take (bench_peers.HELD_OUT)."""


def served(url: str, model: str, prompts: list[str], max_tokens: int) -> tuple[float, list[int]]:
    """`off` for every prompt at once through the server, as `make bench-peers` sends it: the mean
    inter-token time (ms) and each output's length."""
    cell = run_cell(MINIONS_OFF, "chat", minions_request(url, model, "off", max_tokens), prompts, len(prompts))
    if cell.errors:
        raise RuntimeError(f"requests through the server failed: {cell.errors}")
    return cell.row()["itl_ms"], [cell.samples[i].tokens for i in range(len(prompts))]


def alone(engine, prompts: list[list[int]], lengths: list[int], interval_s: float, tag: str) -> float:
    """The same outputs streamed by the engine's in-flight batcher in process, all at once: the mean
    inter-token time (ms), each stream's as a served request's (peers/streams.py). No end token: each
    stream makes exactly its served length."""
    lock, done = threading.Lock(), threading.Semaphore(0)
    arrivals: dict[int, list[tuple[float, int]]] = {i: [] for i in range(len(prompts))}

    def answer_for(i: int):
        def answer(value: EngineResult | Exception) -> None:
            if isinstance(value, Exception):
                raise value
            with lock:
                if value.tokens:
                    arrivals[i].append((time.perf_counter(), len(value.tokens)))
            if value.final:
                done.release()
        return answer

    calls = [(EngineRequest(f"{tag}-{i}", list(ids), n, streaming=True, stream_interval_s=interval_s,
                            exclude_input_in_output=True), answer_for(i))
             for i, (ids, n) in enumerate(zip(prompts, lengths))]
    start = time.perf_counter()
    engine.batcher.submit(calls)
    for _ in calls:
        done.acquire()
    for request, _ in calls:
        engine.release(request.request_id)
    cell = Cell("engine alone", "chat", len(prompts))
    for i, seen in arrivals.items():
        if seen:
            cell.samples[i] = Sample("", sum(n for _, n in seen), seen[0][0] - start, seen[-1][0] - start)
    return cell.row()["itl_ms"]


def output_lengths(engine, prompts: list[list[int]], max_tokens: int, end_id: int | None, tag: str) -> list[int]:
    """How many tokens greedy decoding makes for each prompt (up to end_id), all in one batch."""
    requests = [EngineRequest(f"{tag}-dry{i}", list(ids), max_tokens, end_id=end_id, ends_sequence=True)
                for i, ids in enumerate(prompts)]
    return [len(result_or_raise(result).tokens) for result in engine.generate_batch(requests)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deploy", type=Path, default=ROOT / "deploy.yaml")
    parser.add_argument("--streams", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--groups", type=int, default=2, help="groups of streams per stream count (more need "
                        "more prompts than MT-bench has: MINIONS_CHAT_SETS, datasets/README.md)")
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    dep = load_deployment(args.deploy)
    orchestrator = orchestrator_settings(dep)
    services = Services.from_settings(orchestrator, load=lambda: 1)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir_for(dep.llm["source"], dep))
    engine = build_engine(engine_settings(dep.llm, dep, orchestrator))
    offset = PROMPT_OFFSET
    rows = []
    with TritonProcess(args.deploy) as server:
        url, model = server.grpc_url, orchestrator.model_name
        served(url, model, warm_up_prompts(1), args.max_tokens)  # first calls pay one-off costs
        for streams in args.streams:
            interval = services.stream_interval_s(orchestrator.llm_stream.interval_ms / 1000, streams)
            ratios, through, by_itself = [], [], []
            for group in range(args.groups):
                prompts = mixed_prompts(streams, offset=offset)
                if len(prompts) < streams:
                    raise MissingPromptSet(f"the chat sets ({','.join(chat_sets())}) ran out of prompts at group "
                                           f"{group + 1} of {streams} streams: fewer --groups, or larger sets")
                offset += -(-streams // len(chat_sets()))
                ids = [encode_prompt(tokenizer, p, chat=True) for p in prompts]
                tag = f"s{streams}g{group}"
                if group % 2 == 0:
                    s, lengths = served(url, model, prompts, args.max_tokens)
                    a = alone(engine, ids, lengths, interval, tag)
                else:  # alone first: the served lengths come from a dry run of the engine (greedy: the same)
                    lengths = output_lengths(engine, ids, args.max_tokens, tokenizer.eos_token_id, tag)
                    a = alone(engine, ids, lengths, interval, tag)
                    s, _ = served(url, model, prompts, args.max_tokens)
                ratios.append(s / a)
                through.append(s)
                by_itself.append(a)
                print(f"{streams} streams, group {group + 1}: through the server {s:.2f} ms/token, alone {a:.2f} "
                      f"({s / a - 1:+.1%})", flush=True)
            rows.append((streams, interval, statistics.median(through), statistics.median(by_itself),
                         statistics.median(ratios)))
    print("\n| streams | stream interval | through the server ms/token | engine alone ms/token | overhead |")
    print("|---:|---:|---:|---:|---:|")
    for streams, interval, s, a, ratio in rows:
        print(f"| {streams} | {1000 * interval:.0f} ms | {s:.2f} | {a:.2f} | {ratio - 1:+.1%} |")
    print("\n(medians over groups; overhead: the median of the groups' ratios, not the ratio of the medians)")


if __name__ == "__main__":
    exit_on_missing_set(main)
