"""Which draft a round should verify, replayed on the LLM's own greedy text: the vote's learnt weights,
the drafters' own confidence, the served cut (RequestPricing.cut), the same on chances rescaled by
whether the drafts agree (with a table of how often each agreement class was right against its
chances), a cut by net gain, an oracle, and a two-branch tree that verifies both drafts in one pass.

Greedy, the LLM accepts exactly the common prefix of a draft and its own continuation, so once the
deployment's LLM (llama.cpp, in process) has decoded a prompt, any drafting policy can be replayed on
it round by round without the LLM: the lookup SSMs (as the deployment configures them, with their
learnt confidence and the suffix corpus) draft from the text so far, the policy picks what to verify,
and the accepted length is read off the text. Each policy replays all requests in order on fresh
engines, releasing each request as the server does, so the corpus and the confidence learn as served.

Time is estimated from the LLM's own cost of a verification of k draft tokens, measured here at each
request's context (t(0) is a plain step): a policy's speedup is tokens × t(0) / Σ t(k), drafting and
orchestration left out. It ranks choice rules; it is not a served number (`make bench-peers` is).
A round with no draft is one plain step. Workloads: chat, code edits, passages, and multi-turn code
(bench-peers' conversations, each turn with the LLM's own answers in its history; its last turns are
also reported alone). The answers and timings are saved beside `--out`; `--replay` reads them back, so
a rule is compared in seconds rather than decoded again.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable, Iterator
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
from minions.engines.draft_confidence import token_log_probs
from minions.speculation.pricing.worth import ChanceCalibration, cheapest_verification, survival
from minions.speculation.voting import vote
from minions.speculation.weights import SsmWeights, draft_score
from minions.text.datasets import load_prompts, mixed_prompts
from minions.text.prompt import encode_prompt

from .peers.conversations import conversations

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
    request_seconds: list[float] = field(default_factory=list)
    """Each request's estimated time, in order (a subset's speedup: `speedup_of`)."""


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


class ServedCut:
    """The served rule (RequestPricing.cut): each draft cut to its cheapest verification by its chances,
    scaled by how the request's drafts fared against theirs (ChanceCalibration, scored here against the
    text at once, as the served request settles them later); of the drafts, the cheapest per token."""

    def __init__(self) -> None:
        self.calibration = ChanceCalibration()

    def new_request(self) -> None:
        self.calibration = ChanceCalibration()

    def __call__(self, c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
        best, best_logs, best_cost, first = [], [], t(0), None
        for cand in c.values():
            if not cand.draft:
                continue
            logs = token_log_probs(cand.chances[: len(cand.draft)])
            n, cost = cheapest_verification(logs, {k: t(k) for k in range(len(logs) + 1)}, self.calibration.factor)
            first = first or (cand.draft, logs)
            if n and cost is not None and cost < best_cost:
                best, best_logs, best_cost = cand.draft[:n], logs[:n], cost
        return self._calibrated(best, best_logs, first, truth)

    def _calibrated(self, best: list[int], best_logs: list[float], first: tuple[list[int], list[float]] | None,
                    truth: list[int]) -> tuple[list[int], int]:
        """The round's verdict on the chosen draft (`best`, with its log chances), into the request's
        calibration: the draft as verified, or where none was, the first draft priced out, scored against
        the text as the served request settles it; (draft, accepted)."""
        accepted = common_prefix_len(best, truth)
        if best:
            self.calibration.observe(best_logs, accepted)
        elif first:
            self.calibration.observe(first[1], common_prefix_len(first[0], truth))
        return best, accepted


def agreement_classes(c: dict[str, Candidate]) -> dict[str, list[tuple[str, int]]]:
    """Each draft position's class against the other drafts of the round, and its bucket of 4
    positions: `agree` (another draft has the same tokens up to here), `differ` (another draft goes
    on, otherwise), `alone` (no other draft is this long)."""
    out = {}
    for ssm, x in c.items():
        others = [o.draft for s, o in c.items() if s != ssm]
        agreed = max((common_prefix_len(x.draft, o) for o in others), default=0)
        out[ssm] = [("agree" if i < agreed else "differ" if any(len(o) > i for o in others) else "alone",
                     min(i // 4, 3)) for i in range(len(x.draft))]
    return out


def rescaled(c: dict[str, Candidate], classes: dict[str, list[tuple[str, int]]],
             chance: Callable[[str, float, tuple[str, int]], float]) -> dict[str, Candidate]:
    """Every draft with each position's chance replaced by `chance(ssm, chance, class)`, kept from
    rising along the draft (the tokens up to a position are right no more often than those before)."""
    out = {}
    for ssm, x in c.items():
        chances, before = [], 1.0
        for p, cls in zip(x.chances, classes[ssm]):
            before = min(before, chance(ssm, p, cls))
            chances.append(max(before, 1e-6))
        out[ssm] = Candidate(x.draft, chances)
    return out


def settled_positions(c: dict[str, Candidate], classes: dict[str, list[tuple[str, int]]],
                      truth: list[int]) -> Iterator[tuple[str, float, tuple[str, int], bool]]:
    """(ssm, chance, class, right) of each draft position the text settles: every draft's, verified or not."""
    for ssm, x in c.items():
        n = common_prefix_len(x.draft, truth)
        for i, (p, cls) in enumerate(zip(x.chances, classes[ssm][: len(truth)])):
            yield ssm, p, cls, i < n


class ServedCutByAgreement(ServedCut):
    """The served cut on chances rescaled by how drafts of each agreement class fared so far (all
    requests of the workload, as the lookups' confidence is server-wide): the ratio of positions right
    to the chances predicted, per class and bucket (`agreement_classes`), with `prior` positions'
    worth of ratio 1."""

    def __init__(self, prior: float = 20.0) -> None:
        super().__init__()
        self.prior = prior
        self.counts: dict[tuple[str, int], list[float]] = {}
        """(class, bucket) -> [positions right, chances predicted]."""

    def __call__(self, c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
        classes = agreement_classes(c)
        scaled = rescaled(c, classes, self._chance)
        for _, p, key, right in settled_positions(c, classes, truth):  # as the engines settle them
            counts = self.counts.setdefault(key, [0.0, 0.0])
            counts[0] += right
            counts[1] += p
        return super().__call__(scaled, truth, t)

    def _chance(self, ssm: str, p: float, key: tuple[str, int]) -> float:
        right, predicted = self.counts.get(key, (0.0, 0.0))
        return p * (right + self.prior) / (predicted + self.prior)

    def table(self) -> str:
        return "\n".join(f"| {k} | {b * 4}-{b * 4 + 3} | {right / predicted:.2f} |"
                         for (k, b), (right, predicted) in sorted(self.counts.items()) if predicted)


class HindsightChances(ServedCut):
    """A bound on every cut by chances: the served cut (the request's calibration kept) on chances no
    served rule knows, each position's being how often positions like it were right over the whole
    workload, counted in a first pass over it (`learning`). Positions alike are of one SSM, chance
    decile, position bucket and, with `by_agreement`, agreement class (`agreement_classes`)."""

    def __init__(self, by_agreement: bool = True) -> None:
        super().__init__()
        self.by_agreement = by_agreement
        self.learning = True
        self.counts: dict[tuple, list[int]] = {}
        """bin -> [positions right, positions seen]."""

    def _bin(self, ssm: str, cls: tuple[str, int], p: float) -> tuple:
        return ssm, cls[0] if self.by_agreement else "", cls[1], min(int(p * 10), 9)

    def __call__(self, c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
        classes = agreement_classes(c)
        if not self.learning:
            return super().__call__(rescaled(c, classes, self._chance), truth, t)
        for ssm, p, cls, right in settled_positions(c, classes, truth):
            counts = self.counts.setdefault(self._bin(ssm, cls, p), [0, 0])
            counts[0] += right
            counts[1] += 1
        return super().__call__(c, truth, t)

    def _chance(self, ssm: str, p: float, cls: tuple[str, int]) -> float:
        right, seen = self.counts.get(self._bin(ssm, cls, p), (0, 0))
        return right / seen if seen else p


class NetGain(ServedCut):
    """The draft and length with the most expected tokens net of their time at `rate` tokens a second,
    E(k) - rate * t(k) (k = 0: a plain step): the round that adds most to the whole request's rate
    when the time it saves is spent at `rate` (Dinkelbach's rule for a ratio of sums). `rate`: a plain
    step's (None), or the request's own so far times `lift`."""

    def __init__(self, lift: float | None = None) -> None:
        super().__init__()
        self.lift = lift
        self.tokens = self.seconds = 0.0

    def new_request(self) -> None:
        super().new_request()
        self.tokens = self.seconds = 0.0

    def __call__(self, c: dict[str, Candidate], truth: list[int], t: CostTable) -> tuple[list[int], int]:
        rate = 1.0 / t(0)
        if self.lift is not None and self.seconds > 0:
            rate = max(rate, self.lift * self.tokens / self.seconds)
        best, best_logs, best_value, first = [], [], 1.0 - rate * t(0), None
        scale = self.calibration.factor
        for cand in c.values():
            if not cand.draft:
                continue
            logs = token_log_probs(cand.chances[: len(cand.draft)])
            first = first or (cand.draft, logs)
            expected = 1.0
            for n, alive in enumerate(survival(logs), start=1):
                expected += min(1.0, scale * alive)
                value = expected - rate * t(n)
                if value > best_value:
                    best, best_logs, best_value = cand.draft[:n], logs[:n], value
        best, accepted = self._calibrated(best, best_logs, first, truth)
        self.tokens += min(accepted + 1, len(truth))
        self.seconds += t(len(best))
        return best, accepted


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
        if hasattr(policy, "new_request"):
            policy.new_request()
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
        tally.request_seconds.append(seconds)
    return tally


def speedup_of(tally: Tally, requests: list[tuple[list[int], list[int]]], which: list[int], t: CostTable) -> float:
    """The estimated speedup over the requests at indices `which` alone."""
    return sum(len(requests[i][1]) for i in which) * t(0) / sum(tally.request_seconds[i] for i in which)


def workloads(count: int, copy_count: int, offset: int) -> dict[str, list[str]]:
    return {"chat": mixed_prompts(count, offset=offset),
            "code_edit": load_prompts("code_edit", copy_count, offset),
            "passages": load_prompts("passages", copy_count, offset)}


def conversation_requests(llm, tokenizer, users: list[list[str]], max_tokens: int, keep: int, eos: set[int],
                          costs: dict[int, list[float]]) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """Every turn of each conversation, in order, each with the LLM's own answers before it in its
    history (as bench-peers' multi-turn workloads send them), and the indices of the last turns."""
    requests, last = [], []
    for turns in users:
        messages: list[dict] = []
        for text in turns:
            messages.append({"role": "user", "content": text})
            ids = encode_prompt(tokenizer, json.dumps(messages), chat=True)[-keep:]
            out = reference(llm, ids, max_tokens, eos, costs)
            requests.append((ids, out))
            messages.append({"role": "assistant",
                             "content": tokenizer.decode([x for x in out if x not in eos], skip_special_tokens=True)})
        last.append(len(requests) - 1)
    return requests, last


def decode_references(args: argparse.Namespace, dep, orch, settings) -> tuple[
        dict[str, list[tuple[list[int], list[int]]]], list[int], dict[int, list[float]]]:
    """Each workload's prompts with the LLM's greedy answers, the multi-turn workload's last turns, and
    the verification timings taken on the way."""
    import llama_cpp
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir_for(dep.llm["source"], dep)))
    llm = llama_cpp.Llama(settings[dep.llm["name"]].model_path, n_ctx=orch.limits.context, n_threads=args.threads,
                          n_batch=512, logits_all=True, verbose=False)  # a verification computes every row
    eos = {llm.token_eos(), *(t for t in [tokenizer.eos_token_id] if t is not None)}
    costs: dict[int, list[float]] = {}
    requests: dict[str, list[tuple[list[int], list[int]]]] = {}
    keep = orch.limits.context - args.max_tokens - 40
    for workload, prompts in workloads(args.prompts, args.copy_prompts, args.offset).items():
        for text in prompts:
            ids = encode_prompt(tokenizer, text, chat=True)[-keep:]
            requests.setdefault(workload, []).append((ids, reference(llm, ids, args.max_tokens, eos, costs)))
    requests["multi_turn_code"], last_turns = conversation_requests(
        llm, tokenizer, conversations("multi_turn_code", args.conversations, args.offset), args.max_tokens, keep,
        eos, costs)
    return requests, last_turns, costs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--deploy", default=str(ROOT / "deploy.yaml"))
    p.add_argument("--prompts", type=int, default=24, help="chat prompts (mixed sets)")
    p.add_argument("--copy-prompts", type=int, default=12, help="code_edit and passages prompts each")
    p.add_argument("--conversations", type=int, default=6, help="multi-turn code conversations (three turns)")
    p.add_argument("--offset", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "bench_results" / "draft_choice.json")
    p.add_argument("--replay", type=Path, help="replay the answers and timings an earlier run saved "
                                               "(<out>.texts.json) instead of decoding them again")
    p.add_argument("--policies", nargs="+", help="only the policies whose names contain one of these")
    args = p.parse_args()

    dep = load_deployment(Path(args.deploy))
    orch = orchestrator_settings(dep)
    settings = {m["name"]: engine_settings(m, dep, orch) for m in [dep.llm, *dep.ssms]}
    lookups = [s for s in settings.values() if s.engine in (EngineKind.NGRAM, EngineKind.SUFFIX)]
    k = orch.limits.num_draft_tokens
    texts = args.out.with_suffix(".texts.json")
    if args.replay:
        saved = json.loads(args.replay.read_text())
        requests = {w: [(list(a), list(b)) for a, b in reqs] for w, reqs in saved["requests"].items()}
        costs, last_turns = {int(kk): v for kk, v in saved["costs"].items()}, saved["last_turns"]
    else:
        requests, last_turns, costs = decode_references(args, dep, orch, settings)
        texts.parent.mkdir(parents=True, exist_ok=True)
        texts.write_text(json.dumps({"requests": requests, "costs": costs, "last_turns": last_turns}))
    t = CostTable(costs)
    print("t(k) ms:", ", ".join(f"{kk}: {t(kk) * 1000:.1f}" for kk in COSTS_AT))

    names = [s.model_name for s in lookups]
    policies: dict[str, Callable[[], Policy]] = {
        **{f"single:{n}": (lambda n=n: single(n)) for n in names},
        "vote (weights)": lambda: WeightedVote(names),
        "confidence": lambda: by_confidence,
        "confidence + cut": lambda: by_confidence_cut,
        "served cut (calibrated)": ServedCut,
        "served cut, chances by agreement": ServedCutByAgreement,
        "served cut, hindsight chances (bound)": lambda: HindsightChances(by_agreement=False),
        "served cut, hindsight chances by agreement (bound)": HindsightChances,
        "net gain at a plain step's rate": NetGain,
        "net gain at the request's rate": lambda: NetGain(lift=1.0),
        "oracle": lambda: oracle,
        "tree (both drafts)": lambda: tree,
    }
    if args.policies:
        policies = {n: m for n, m in policies.items() if any(x in n for x in args.policies)}
    report: dict[str, dict[str, dict]] = {}
    print("\n| workload | policy | speedup (est.) | tokens / round | accepted / verified draft token |"
          " verified rounds |")
    print("|---|---|---|---|---|---|")
    agreement: dict[str, str] = {}
    for workload, reqs in requests.items():
        for label, make in policies.items():
            engines = {s.model_name: build_engine(s) for s in lookups}
            policy = make()
            if isinstance(policy, HindsightChances):  # its first pass counts the bins
                replay(policy, engines, reqs, k, t, label)
                engines, policy.learning = {s.model_name: build_engine(s) for s in lookups}, False
            tally = replay(policy, engines, reqs, k, t, label)
            if isinstance(policy, ServedCutByAgreement):
                agreement[workload] = policy.table()
            speedup = tally.tokens * t(0) / tally.seconds
            report.setdefault(workload, {})[label] = tally.__dict__ | {"speedup": speedup}
            print(f"| {workload} | {label} | {speedup:.3f}× | {tally.tokens / tally.rounds:.2f} | "
                  f"{tally.accepted / max(1, tally.drafted):.2f} | {tally.verified} |")
            if workload == "multi_turn_code":
                last = speedup_of(tally, reqs, last_turns, t)
                report[workload][label]["last_turn_speedup"] = last
                print(f"| {workload}, last turn | {label} | {last:.3f}× | | | |")
    print("\nPositions right / the chances predicted, by agreement between the drafts (all drafts, verified or not):")
    print("\n| workload | class | positions | right / predicted |\n|---|---|---|---:|")
    for workload, rows in agreement.items():
        print("\n".join(f"| {workload} |{row[1:]}" for row in rows.splitlines()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"costs_ms": {kk: t(kk) * 1000 for kk in COSTS_AT}, "report": report}, indent=1))
    print(f"\nwritten {args.out}")


if __name__ == "__main__":
    main()
