"""Every call in the package that passes more than four arguments names those beyond the first two
(a reader sees what each value is; a reordered signature cannot swap two of them silently). Logging
calls are exempt: their extra arguments are the format's values. Read from the source (ast)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "python_backend" / "minions"
MOST_POSITIONAL = 4


def bare_calls(source: str) -> list[tuple[int, str]]:
    """(line, callee) of each call with more than MOST_POSITIONAL positional arguments, logging's aside."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or len(node.args) <= MOST_POSITIONAL:
            continue
        callee = ast.unparse(node.func)
        if any(isinstance(a, ast.Starred) for a in node.args) or callee.split(".")[0] in ("log", "logging"):
            continue
        found.append((node.lineno, callee))
    return found


def test_no_call_in_the_package_passes_more_than_four_bare_arguments():
    offenders = [f"{path.relative_to(PACKAGE)}:{line} {callee}" for path in sorted(PACKAGE.rglob("*.py"))
                 for line, callee in bare_calls(path.read_text())]
    assert not offenders, "name the arguments after the first two:\n" + "\n".join(offenders)


def test_the_check_sees_a_bare_call_and_lets_logging_and_keywords_pass():
    source = ("f(1, 2, 3, 4, 5)\nf(1, 2, c=3, d=4, e=5)\nlog.info('%s %s %s %s', 1, 2, 3, 4)\n"
              "g(*args, 1, 2, 3, 4)\n")
    assert bare_calls(source) == [(1, "f")]
