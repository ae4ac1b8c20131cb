"""The default against `off` (or another mode) prompt by prompt on one server: what each pair of
requests measured, and a cell's ratios with their spread.

Two servers taking turns (bench_peers) differ by more than the effects issue 27's "never slower than
`off`" is about: a cell read 0.86-1.08x with no draft verified at all. Sent to one server one after
the other, the default and `off` on each prompt share the machine's minute, so the ratio of their
decode speeds is the default's own cost or gain. Only decoding is compared: the second request of a
pair finds the prompt in the prefix cache the first filled. A mode drafting with an SSM that learns from finished
requests (suffix) would find the default's answer to the prompt: such modes are not the other mode
of a pair (bench_paired refuses them).
"""

from __future__ import annotations

import dataclasses
import random
import statistics
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Answer:
    """One request as its client saw it."""

    text: str
    tokens: int
    decode_s: float
    """From the first output token to the last."""
    drafted: int = 0
    """Draft tokens the LLM verified for it."""

    @property
    def s_per_token(self) -> float | None:
        return self.decode_s / (self.tokens - 1) if self.tokens > 1 else None


@dataclass(frozen=True)
class Pair:
    """The default's answer and the other mode's (`off`) to one prompt on one server (`ask_pair`)."""

    default: Answer
    other: Answer
    control: Answer | None = None
    """The other mode asked once more, right after: how far two identical requests' times differ."""

    @property
    def speed_ratio(self) -> float | None:
        """The other mode's time per decoded token over the default's (above 1: the default decodes faster)."""
        d, o = self.default.s_per_token, self.other.s_per_token
        return None if d is None or o is None or d <= 0 else o / d


Ask = Callable[[list[dict], str | None], Answer]
"""A request to the server: the conversation so far (chat messages), the speculation mode (None: the
deployment's default)."""


Together = Callable[[list[tuple[list[dict], str | None]]], list[Answer]]
"""Several requests sent at once (each a conversation and a mode), their answers in order."""


def one_by_one(ask: Ask) -> Together:
    return lambda calls: [ask(messages, mode) for messages, mode in calls]


def ask_pair(ask: Ask, messages: list[dict], against: str = "off", other_first: bool = False,
             control: bool = False) -> Pair:
    """The default and the other mode on the same messages, the default first unless `other_first`;
    with `control`, the other mode once more after both (the pair's noise floor).
    The default goes first where either mode drafts with an SSM that learns from finished requests
    (suffix), so that it never drafts the other's answer to this prompt; else the order alternates, as
    the second request finds the first's prompt in every engine's prefix cache, a model SSM's too."""
    return _pairs(one_by_one(ask), [messages], against, other_first, control)[0]


def _pairs(together: Together, conversations: list[list[dict]], against: str, other_first: bool,
           control: bool, prime: Together | None = None) -> list[Pair]:
    """`ask_pair` on every conversation, each mode's requests sent together; `prime` first, where given
    (`converse_group`)."""
    if prime is not None:
        prime([(m, "off") for m in conversations])
    first, second = (against, None) if other_first else (None, against)
    a = together([(m, first) for m in conversations])
    b = together([(m, second) for m in conversations])
    pairs = [Pair(y, x) if other_first else Pair(x, y) for x, y in zip(a, b)]
    if control:
        again = together([(m, against) for m in conversations])
        pairs = [dataclasses.replace(pair, control=c) for pair, c in zip(pairs, again)]
    return pairs


def converse_pair(ask: Ask, turns: Sequence[str], against: str = "off", other_first: bool = False,
                  control: bool = False) -> Pair:
    """A conversation's turns with the default, each turn's history holding its earlier answers, and
    its last turn paired (`ask_pair`)."""
    return converse_group(one_by_one(ask), [turns], against, other_first, control)[0]


def converse_group(together: Together, talks: Sequence[Sequence[str]], against: str = "off",
                   other_first: bool = False, control: bool = False, prime: Together | None = None) -> list[Pair]:
    """`converse_pair` on several conversations at once: each step (a turn before the last with the
    default, then each mode on the last turns) sends every conversation's request together, so that
    the server decodes them as that many streams (`concurrently`). `prime`: the last turns asked first
    as `off` for a token (a Together of one-token requests), so that both modes find every prompt in
    the prefix cache: else the first mode's streams decode beside the others' prefills, the second's
    alone, and a ratio of their decode times measures that."""
    histories: list[list[dict]] = [[] for _ in talks]
    for i in range(max(len(turns) for turns in talks) - 1):
        going = [j for j, turns in enumerate(talks) if i < len(turns) - 1]
        for j in going:
            histories[j].append({"role": "user", "content": talks[j][i]})
        answers = together([(histories[j], None) for j in going])
        for j, answer in zip(going, answers):
            histories[j].append({"role": "assistant", "content": answer.text})
    last = [[*history, {"role": "user", "content": turns[-1]}] for history, turns in zip(histories, talks)]
    return _pairs(together, last, against, other_first, control, prime)


def concurrently(ask: Ask) -> Together:
    """Each request from a thread of its own, all started at once."""
    def together(calls: list[tuple[list[dict], str | None]]) -> list[Answer]:
        with ThreadPoolExecutor(max_workers=max(len(calls), 1)) as pool:
            return list(pool.map(lambda call: ask(*call), calls))
    return together


@dataclass
class PairedCell:
    """One workload's pairs."""

    workload: str
    pairs: list[Pair] = field(default_factory=list)

    def row(self, resamples: int = 2000, seed: int = 0) -> dict:
        """Median of the pairs' speed ratios with a bootstrap 90% interval, the time ratio (all of the
        other mode's decode time, each scaled to the default's token count, over all the default's: a
        long copy weighs what it saves), draft tokens verified per default request, outputs equal."""
        timed = [p for p in self.pairs if p.speed_ratio is not None]
        ratios = [p.speed_ratio for p in timed]
        row = {"workload": self.workload, "pairs": len(self.pairs), "timed": len(timed),
               "same": sum(p.default.text == p.other.text for p in self.pairs),
               "drafted_per_request": statistics.mean(p.default.drafted for p in self.pairs) if self.pairs else 0.0,
               "median": None, "low": None, "high": None, "time_ratio": None, "control_ratio": None}
        if not ratios:
            return row
        rng = random.Random(seed)
        medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(resamples))
        default_s = sum(p.default.decode_s for p in timed)  # > 0: a timed pair's default decoded for a while
        other_s = sum(p.other.s_per_token * (p.default.tokens - 1) for p in timed)
        row.update(median=statistics.median(ratios), low=medians[int(0.05 * resamples)],
                   high=medians[int(0.95 * resamples) - 1], time_ratio=other_s / default_s)
        controlled = [p for p in timed if p.control is not None and p.control.s_per_token]
        if controlled:  # the same measure between the other mode's two requests: 1 but for noise
            row["control_ratio"] = (sum(p.other.s_per_token for p in controlled)
                                    / sum(p.control.s_per_token for p in controlled))
        return row


def format_rows(rows: list[dict], against: str = "off") -> str:
    """A markdown table of PairedCell rows."""
    def f(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    control = any(r.get("control_ratio") is not None for r in rows)
    lines = [f"| workload | pairs | default / `{against}`, median of pairs | 90% interval | time ratio "
             + (f"| control: `{against}` / `{against}` again " if control else "")
             + "| drafted / request | same |", "|---|---:|---:|---|---:|" + ("---:|" if control else "") + "---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workload']} | {r['timed']} | {f(r['median'])} | {f(r['low'])}–{f(r['high'])} | "
                     f"{f(r['time_ratio'])} | " + (f"{f(r.get('control_ratio'))} | " if control else "")
                     + f"{r['drafted_per_request']:.1f} | {r['same']}/{r['pairs']} |")
    return "\n".join(lines)
