"""benchmarks.peers.paired and bench_paired: the default then `off` (or another mode) on each prompt of
one server, a cell's ratios, and the modes a pair cannot compare."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.bench_paired import UnknownCell, learning_ssms, run
from benchmarks.peers.paired import (Answer, Pair, PairedCell, ask_pair, concurrently, converse_group, converse_pair,
                                     format_rows)
from minions.deploy.config import load_deployment
from minions.errors import InvalidRequest
from minions.text.datasets import COPY_HEAVY, DATASETS
from tests.support.datasets import write_prompt_sets
from harness.triton_process import ROOT


class Recorder:
    """A server that answers every request with the mode's name and counts its calls, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict], str | None]] = []

    def __call__(self, messages: list[dict], speculation: str | None) -> Answer:
        self.calls.append(([dict(m) for m in messages], speculation))
        return Answer(f"answer {len(self.calls)}", 3, 0.2)


def test_the_default_asks_before_off_so_no_drafter_has_seen_offs_answer():
    server = Recorder()
    pair = ask_pair(server, [{"role": "user", "content": "hi"}])
    assert [mode for _, mode in server.calls] == [None, "off"]
    assert pair.default.text == "answer 1" and pair.other.text == "answer 2"


def test_the_other_mode_may_ask_first():
    server = Recorder()
    pair = ask_pair(server, [{"role": "user", "content": "hi"}], "single:ssm_q4", other_first=True)
    assert [mode for _, mode in server.calls] == ["single:ssm_q4", None]
    assert pair.other.text == "answer 1" and pair.default.text == "answer 2"


def test_a_control_asks_the_other_mode_again_after_the_pair():
    server = Recorder()
    pair = ask_pair(server, [{"role": "user", "content": "hi"}], control=True)
    assert [mode for _, mode in server.calls] == [None, "off", "off"]
    assert pair.control.text == "answer 3"


def test_a_cells_control_ratio_is_the_other_modes_time_over_its_own_again():
    pairs = [Pair(Answer("a", 11, 1.0), Answer("a", 11, 1.1), Answer("a", 11, 1.0)),
             Pair(Answer("a", 11, 1.0), Answer("a", 11, 0.9), Answer("a", 11, 1.1))]
    row = PairedCell("x", pairs).row()
    assert row["control_ratio"] == pytest.approx(2.0 / 2.1)
    assert "`off` / `off` again" in format_rows([row]) and "0.952" in format_rows([row])
    assert PairedCell("x", [Pair(Answer("a", 11, 1.0), Answer("a", 11, 1.0))]).row()["control_ratio"] is None


def test_a_conversation_carries_the_defaults_answers_and_pairs_its_last_turn():
    server = Recorder()
    converse_pair(server, ["edit the file", "now rename", "and again"], against="single:ssm_ngram")
    assert [mode for _, mode in server.calls] == [None, None, None, "single:ssm_ngram"]
    last, last_off = server.calls[2][0], server.calls[3][0]
    assert last == last_off, "the last turn is sent twice on the same history"
    assert [m["role"] for m in last] == ["user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in last if m["role"] == "assistant"] == ["answer 1", "answer 2"]


def pair(default_s: float, off_s: float, tokens: int = 11, drafted: int = 0, same: bool = True) -> Pair:
    return Pair(Answer("a", tokens, default_s, drafted), Answer("a" if same else "b", tokens, off_s))


def test_a_cells_row():
    cell = PairedCell("code", [pair(1.0, 1.2, drafted=8), pair(1.0, 0.9), pair(2.0, 2.0, same=False),
                               pair(1.0, 1.0, tokens=1)])  # one token: no decode time, not timed
    row = cell.row()
    assert row["pairs"] == 4 and row["timed"] == 3 and row["same"] == 3
    assert row["median"] == pytest.approx(statistics.median([1.2, 0.9, 1.0]))
    assert row["time_ratio"] == pytest.approx((1.2 + 0.9 + 2.0) / (1.0 + 1.0 + 2.0)), "a long request weighs its time"
    assert row["drafted_per_request"] == pytest.approx(2.0)
    assert row["low"] <= row["median"] <= row["high"]
    assert row["low"] == pytest.approx(0.9) and row["high"] == pytest.approx(1.2), "three pairs: resamples span them"


def test_off_is_scaled_to_the_defaults_length():
    """A default that stopped earlier is not credited with `off`'s longer decode."""
    cell = PairedCell("x", [Pair(Answer("a", 11, 1.0), Answer("ab", 21, 2.0))])
    assert cell.row()["time_ratio"] == pytest.approx(1.0)


def test_an_empty_cell_and_the_table():
    rows = [PairedCell("none").row(), PairedCell("one", [pair(1.0, 1.1)]).row()]
    assert rows[0]["median"] is None
    table = format_rows(rows).splitlines()
    assert table[2].startswith("| none | 0 | - |") and "| 1.100 |" in table[3]


def test_modes_whose_drafters_learn_from_finished_requests_are_refused():
    """The second request of a pair follows the default's answer to the same prompt: a suffix drafter
    would draft that answer back."""
    dep = load_deployment(ROOT / "deploy.yaml")
    assert learning_ssms(dep, "off") == [] and learning_ssms(dep, "single:ssm_ngram") == []
    assert learning_ssms(dep, "single:ssm_suffix") == ["ssm_suffix"]
    assert learning_ssms(dep, "vote") == ["ssm_suffix"]
    with pytest.raises(InvalidRequest):
        learning_ssms(dep, "single:nobody")


def test_a_run_pairs_every_prompt_and_alternates_where_allowed(tmp_path, monkeypatch):
    write_prompt_sets(tmp_path, {name: [f"{name} {i}" for i in range(80)] for name in DATASETS | COPY_HEAVY})
    monkeypatch.setenv("MINIONS_DATASETS", str(tmp_path))
    server = Recorder()
    cells = run(["code_edit", "multi_turn_code"], server, prompts=4, conversation_count=2,
                against="single:ssm_ngram", alternate=True)
    assert [c.workload for c in cells] == ["code_edit", "multi_turn_code, last turn"]
    assert [len(c.pairs) for c in cells] == [4, 2]
    single = [mode for _, mode in server.calls[:8]]
    assert single == [None, "single:ssm_ngram", "single:ssm_ngram", None] * 2, "every other pair the other first"
    server.calls.clear()
    run(["code_edit"], server, prompts=2, conversation_count=1, against="off", alternate=False)
    assert [mode for _, mode in server.calls] == [None, "off", None, "off"]


def test_a_run_of_named_cells_asks_only_theirs(tmp_path, monkeypatch):
    write_prompt_sets(tmp_path, {name: [f"{name} {i}" for i in range(80)] for name in DATASETS | COPY_HEAVY})
    monkeypatch.setenv("MINIONS_DATASETS", str(tmp_path))
    server = Recorder()
    cells = run(["code_edit", "passages"], server, prompts=2, conversation_count=1, against="off", alternate=False,
                only=frozenset({"passages"}))
    assert [c.workload for c in cells] == ["passages"]
    asked = [messages[-1]["content"] for messages, _ in server.calls]
    assert len(asked) == 4 and all(a.startswith("passages") for a in asked), asked
    with pytest.raises(UnknownCell, match="no cell named multi_turn_code; the workloads' cells: code_edit, passages"):
        run(["code_edit", "passages"], server, prompts=2, conversation_count=1, against="off", alternate=False,
            only=frozenset({"multi_turn_code"}))
    assert len(server.calls) == 4, "nothing asked before the names are checked"


class Batches:
    """Requests sent together, recorded as one batch each (the modes in order), answered as Recorder does."""

    def __init__(self) -> None:
        self.server, self.batches = Recorder(), []

    def __call__(self, calls):
        self.batches.append([mode for _, mode in calls])
        return [self.server(messages, mode) for messages, mode in calls]


def test_conversations_in_a_group_send_each_step_together():
    """Each turn before the last goes out for every conversation at once with the default, then each
    mode on the last turns at once: the server decodes as many streams as the group holds."""
    batches = Batches()
    pairs = converse_group(batches, [["a1", "a2"], ["b1", "b2"], ["c1"]], against="off")
    assert batches.batches == [[None, None], [None, None, None], ["off", "off", "off"]]
    assert [p.default.text for p in pairs] == ["answer 3", "answer 4", "answer 5"]
    assert [p.other.text for p in pairs] == ["answer 6", "answer 7", "answer 8"]
    history = batches.server.calls[5][0]
    assert [m["content"] for m in history] == ["a1", "answer 1", "a2"], "a conversation keeps its own answers"
    batches = Batches()
    converse_group(batches, [["x"], ["y"]], against="off", other_first=True, control=True)
    assert batches.batches == [["off", "off"], [None, None], ["off", "off"]]


def test_a_primed_group_puts_every_last_turn_in_the_cache_before_the_pairs():
    """Primed, both modes find the prompts cached: neither decodes beside the group's prefills."""
    batches, primer = Batches(), Batches()
    converse_group(batches, [["a1", "a2"], ["b1", "b2"]], against="off", prime=primer)
    assert primer.batches == [["off", "off"]]
    assert [m["content"] for m in primer.server.calls[0][0]] == ["a1", "answer 1", "a2"]
    assert batches.batches == [[None, None], [None, None], ["off", "off"]]


def test_concurrently_answers_in_the_calls_order():
    def echo(messages, mode):
        return Answer(messages[-1]["content"], 3, 0.2)
    answers = concurrently(echo)([([{"role": "user", "content": str(i)}], None) for i in range(5)])
    assert [a.text for a in answers] == ["0", "1", "2", "3", "4"]


def test_a_run_in_streams_pairs_every_prompt_in_groups(tmp_path, monkeypatch):
    write_prompt_sets(tmp_path, {name: [f"{name} {i}" for i in range(80)] for name in DATASETS | COPY_HEAVY})
    monkeypatch.setenv("MINIONS_DATASETS", str(tmp_path))
    server = Recorder()
    cells = run(["code_edit"], server, prompts=5, conversation_count=1, against="off", alternate=False, streams=2)
    assert [len(c.pairs) for c in cells] == [5]
    assert [mode for _, mode in server.calls] == [None, None, "off", "off"] * 2 + [None, "off"], \
        "groups of two, each mode's requests together"
