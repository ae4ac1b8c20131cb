"""Which draft a round should verify, replayed on the LLM's own greedy text: the vote's learnt weights,
the drafters' own confidence, an oracle, and a two-branch tree that verifies both drafts in one pass.

Greedy, the LLM accepts exactly the common prefix of a draft and its own continuation, so once the
deployment's LLM (llama.cpp, in process) has decoded a prompt, any drafting policy can be replayed on
it round by round without the LLM: the lookup SSMs (as the deployment configures them, with their
learnt confidence and the suffix corpus) draft from the text so far, the policy picks what to verify,
and the accepted length is read off the text. Each policy replays all requests in order on fresh
engines, releasing each request as the server does, so the corpus and the confidence learn as served.

Time is estimated from the LLM's own cost of a verification of k draft tokens, measured here at each
request's context (t(0) is a plain step): a policy's speedup is tokens × t(0) / Σ t(k), drafting and
orchestration left out. It ranks choice rules; it is not a served number (`make bench-peers` is).
A round with no draft is one plain step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from minions.decoding.engine_call import EngineRequest
from minions.decoding.tokens import common_prefix_len
from minions.deploy.artifacts import tokenizer_dir_for
from minions.deploy.config import ROOT, load_deployment
from minions.deploy.render import engine_settings, orchestrator_settings
from minions.engines.factory import build_engine
from minions.settings import EngineKind
from minions.speculation.draft_length import survival
from minions.speculation.voting import vote
from minions.speculation.weights import SsmWeights, draft_score
from minions.text.datasets import load_prompts, mixed_prompts
from minions.text.prompt import encode_prompt

COSTS_AT = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32)
"""Draft lengths whose verification is timed; others are interpolated."""


@dataclass
class Candidate:
    draft: list[int]
    chances: list[float]
    """Estimated chance that the first 1, 2, ... tokens are all right (from the engine's log probs)."""

    @property
    def expected(self) -> float:
        return float(sum(self.chances))


@dataclass
class Tally:
    tokens: int = 0
    rounds: int = 0
    verified: int = 0
    drafted: int = 0
    accepted: int = 0
    seconds: float = 0.0
    by_request: list[float] = field(default_factory=list)


class CostTable:
    """t(k): the LLM's median time to verify k draft tokens (k + 1 positions), interpolated."""

    def __init__(self, samples: dict[int, list[float]]) -> None:
        self.ks = sorted(samples)
        self.ts = [statistics.median(samples[k]) for k in self.ks]

    def __call__(self, k: int) -> float:
        return float(np.interp(k, self.ks, self.ts))


Policy = Callable[[dict[str, Candidate], list[int], CostTable], tuple[list[int], int]]
"""(candidates by SSM, the LLM's text from here, costs) -> (tokens verified, accepted)."""


def single(ssm: str) -> Policy:
    def pick(c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
        d = c[ssm].draft
        return d, common_prefix_len(d, truth)
    return pick


def by_confidence(c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
    """The draft with the most tokens expected right (ties: the first SSM named)."""
    best = max(c.values(), key=lambda x: x.expected)
    return best.draft, common_prefix_len(best.draft, truth)


def by_confidence_cut(c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
    """The draft and length with the least expected time per emitted token, (1 + E_k) / t(k) against a
    plain step's 1 / t(0): speculation only where the drafters' own confidence says it pays."""
    best, best_rate = [], 1.0 / t(0)
    for cand in c.values():
        expected = np.cumsum(cand.chances)
        for k in range(1, len(cand.draft) + 1):
            rate = (1.0 + expected[k - 1]) / t(k)
            if rate > best_rate:
                best, best_rate = cand.draft[:k], rate
    return best, common_prefix_len(best, truth)


def oracle(c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
    """The draft that the LLM accepts most of, cut to what it accepts (an upper bound no rule reaches)."""
    best = max(c.values(), key=lambda x: common_prefix_len(x.draft, truth))
    n = common_prefix_len(best.draft, truth)
    return best.draft[:n], n


def tree(c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
    """Every draft verified in one pass, shared prefixes once: the cost of all their distinct tokens,
    the acceptance of the best branch. Returns a stand-in list of the pass's length."""
    drafts = [x.draft for x in c.values() if x.draft]
    if not drafts:
        return [], 0
    nodes = {tuple(d[:i]) for d in drafts for i in range(1, len(d) + 1)}
    return [0] * len(nodes), max(common_prefix_len(d, truth) for d in drafts)


class WeightedVote:
    """The vote as served, asking every SSM each round: the heaviest path by learnt weights."""

    def __init__(self, ssms: list[str]) -> None:
        self.weights = SsmWeights(ssms)

    def __call__(self, c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
        drafts = {s: x.draft for s, x in c.items()}
        chosen = vote(drafts, self.weights.snapshot(list(drafts))).draft
        scores = {s: score for s, d in drafts.items() if (score := draft_score(d, truth)) is not None}
        self.weights.update(scores)
        return chosen, common_prefix_len(chosen, truth)


def reference(llm, prompt: list[int], max_tokens: int, eos: set[int],
              costs: dict[int, list[float]]) -> list[int]:
    """The LLM's greedy continuation of `prompt`, and one timing of each verification length after it."""
    llm.reset()
    llm.eval(prompt)
    out: list[int] = []
    while len(out) < max_tokens:
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(token)
        if token in eos:
            break
        llm.eval([token])
    base = llm.n_tokens
    for k in COSTS_AT:
        llm.n_tokens = base
        filler = (prompt + out)[-(k + 1):]
        t0 = time.perf_counter()
        llm.eval(filler)
        costs.setdefault(k, []).append(time.perf_counter() - t0)
    return out


def replay(policy: Policy, engines: dict[str, object], requests: list[tuple[list[int], list[int]]],
           k: int, t: CostTable, name: str) -> Tally:
    tally = Tally()
    for i, (prompt, out) in enumerate(requests):
        rid = f"{name}-{i}"
        pos, seconds = 0, 0.0
        while pos < len(out):
            seq = prompt + out[:pos]
            candidates = {}
            for ssm, engine in engines.items():
                result = engine.generate(EngineRequest(rid, seq, k, return_log_probs=True,
                                                       exclude_input_in_output=True))
                candidates[ssm] = Candidate(result.tokens[:k], survival(result.log_probs or [])[:k])
            truth = out[pos:]
            verified, accepted = policy(candidates, truth, t)
            emitted = min(accepted + 1, len(truth))
            tally.rounds += 1
            tally.verified += bool(verified)
            tally.drafted += len(verified)
            tally.accepted += accepted
            seconds += t(len(verified))
            pos += emitted
            tally.tokens += emitted
        for engine in engines.values():
            engine.release(rid)
        tally.seconds += seconds
        tally.by_request.append(len(out) * t(0) / seconds)
    return tally


def workloads(count: int, copy_count: int, offset: int) -> dict[str, list[str]]:
    return {"chat": mixed_prompts(count, offset=offset),
            "code_edit": load_prompts("code_edit", copy_count, offset),
            "passages": load_prompts("passages", copy_count, offset)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--prompts", type=int, default=24, help="chat prompts (mixed sets)")
    p.add_argument("--copy-prompts", type=int, default=12, help="code_edit and passages prompts each")
    p.add_argument("--offset", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "draft_choice.json")
    args = p.parse_args()

    import llama_cpp
    from transformers import AutoTokenizer

    dep = load_deployment(Path(args.deploy))
    orch = orchestrator_settings(dep)
    settings = {m["name"]: engine_settings(m, dep, orch) for m in [dep.llm, *dep.ssms]}
    lookups = [s for s in settings.values() if s.engine in (EngineKind.NGRAM, EngineKind.SUFFIX)]
    k = orch.max_num_draft_tokens
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir_for(dep.llm["source"], dep)))
    llm = llama_cpp.Llama(settings[dep.llm["name"]].model_path, n_ctx=orch.max_context, n_threads=args.threads,
                          n_batch=512, logits_all=True, verbose=False)  # a verification computes every row
    eos = {llm.token_eos(), *(t for t in [tokenizer.eos_token_id] if t is not None)}
    costs: dict[int, list[float]] = {}
    requests: dict[str, list[tuple[list[int], list[int]]]] = {}
    for workload, prompts in workloads(args.prompts, args.copy_prompts, args.offset).items():
        for text in prompts:
            ids = encode_prompt(tokenizer, text, chat=True)[-(orch.max_context - args.max_tokens - 40):]
            requests.setdefault(workload, []).append((ids, reference(llm, ids, args.max_tokens, eos, costs)))
    t = CostTable(costs)
    print("t(k) ms:", ", ".join(f"{kk}: {t(kk) * 1000:.1f}" for kk in COSTS_AT))

    names = [s.model_name for s in lookups]
    policies: dict[str, Callable[[], Policy]] = {
        **{f"single:{n}": (lambda n=n: single(n)) for n in names},
        "vote (weights)": lambda: WeightedVote(names),
        "confidence": lambda: by_confidence,
        "confidence + cut": lambda: by_confidence_cut,
        "oracle": lambda: oracle,
        "tree (both drafts)": lambda: tree,
    }
    report: dict[str, dict[str, dict]] = {}
    print("\n| workload | policy | speedup (est.) | tokens / round | accepted / verified draft token |"
          " verified rounds |")
    print("|---|---|---|---|---|---|")
    for workload, reqs in requests.items():
        for label, make in policies.items():
            engines = {s.model_name: build_engine(s) for s in lookups}
            tally = replay(make(), engines, reqs, k, t, label)
            speedup = tally.tokens * t(0) / tally.seconds
            report.setdefault(workload, {})[label] = tally.__dict__ | {"speedup": speedup}
            print(f"| {workload} | {label} | {speedup:.3f}× | {tally.tokens / tally.rounds:.2f} | "
                  f"{tally.accepted / max(1, tally.drafted):.2f} | {tally.verified} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"costs_ms": {kk: t(kk) * 1000 for kk in COSTS_AT}, "report": report}, indent=1))
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
