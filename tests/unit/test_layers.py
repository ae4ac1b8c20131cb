"""The package's layers: every import points down a floor or stays in its own folder, so no folder
cycle can form; what tests and tools share lives in `harness/`, which imports neither; nothing outside
`tests/` imports the tests, and only benchmark code and its own tests import `benchmarks`.

Read from the source's own import statements (ast), so the check runs anywhere `make test` runs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python_backend" / "minions"

FLOORS: list[set[str]] = [
    {"errors", "settings_fields"},
    {"settings"},
    {"text", "trtllm_settings"},
    {"decoding"},
    {"engines", "speculation"},
    {"serving"},
    {"triton"},
    {"deploy"},
    {"distill", "frontend"},
]
"""Bottom first: shared errors and how a setting is declared; the defaults; text, and TensorRT-LLM models' settings; the decoding rules and
the engine call every layer above shares; the engines beside the speculation that drives them (neither
imports the other); a request's way in and out; the Triton adapters; deployment tooling; training and the
OpenAI frontend."""

FLOOR = {part: i for i, parts in enumerate(FLOORS) for part in parts}


def _part(module: str) -> str | None:
    """`minions.engines.api` -> `engines`; `minions.settings` -> `settings`; None outside the package."""
    names = module.split(".")
    if names[0] != "minions" or len(names) < 2:
        return None
    return names[1]


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    """Every module `path` imports (relative imports resolved against `package`), with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return found


def _modules(folder: Path, prefix: str):
    for path in sorted(folder.rglob("*.py")):
        rel = path.relative_to(folder).with_suffix("")
        names = [prefix, *rel.parts]
        package = ".".join(names if rel.name == "__init__" else names[:-1])
        yield path, package


def test_every_folder_of_the_package_has_a_floor():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert folders | modules == set(FLOOR), "a new folder or module needs its floor in FLOORS"


def test_imports_only_point_down():
    upward = []
    for path, package in _modules(PACKAGE, "minions"):
        here = _part(package + ".x") if package != "minions" else None
        if here is None:
            continue
        for line, module in _imports(path, package):
            there = _part(module)
            if there is None or there == here:
                continue
            if there not in FLOOR or FLOOR[there] >= FLOOR[here]:
                upward.append(f"{path.relative_to(ROOT)}:{line} ({here}) imports {module} ({there})")
    assert not upward, "imports that do not point down a floor:\n" + "\n".join(upward)


def _importers(folder: str, top: str, allowed: set[str] = frozenset()) -> list[str]:
    """Every `folder` module (but those named in `allowed`) that imports a module of package `top`."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        if ".venv" in path.parts or path.name in allowed:
            continue
        for line, module in _imports(path, "x"):
            if module.split(".")[0] == top:
                found.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("folder", ["benchmarks", "loadtest", "client", "python_backend", "harness"])
def test_nothing_outside_the_tests_imports_them(folder):
    """Tools stand on `harness/` (the server as a process, metrics, kept prompts), not on the test suite."""
    found = _importers(folder, "tests")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("folder", ["tests", "python_backend", "client", "harness"])
def test_nothing_but_benchmarks_imports_benchmarks(folder):
    """Benchmarks stand on the harness, never the reverse; only the tests of benchmark code itself (test_bench_*, test_soak_trend, test_gpu_check, and the chaos
    tool's unit tests and its short run in make test) import it."""
    allowed = {"test_bench_load.py", "test_bench_peers.py", "test_bench_paired.py", "test_bench_draft_choice.py",
               "test_soak_trend.py", "test_gpu_check.py", "test_chaos.py", "test_chaos_run.py"}
    found = _importers(folder, "benchmarks", allowed)
    assert not found, "\n".join(found)


def test_the_check_sees_an_upward_import(tmp_path):
    """The parser resolves relative imports, so `from ..serving import flow` in engines/ is caught."""
    module = tmp_path / "x.py"
    module.write_text("from ..serving import flow\nfrom minions.triton.shm import sweep_orphaned_shm\n")
    imported = [_part(m) for _, m in _imports(module, "minions.engines")]
    assert imported == ["serving", "triton"]
    assert all(FLOOR[p] > FLOOR["engines"] for p in imported)
