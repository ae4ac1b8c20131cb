"""Calls in the package: one that passes more than four arguments names those beyond the first two (a
reader sees what each value is; a reordered signature cannot swap two of them silently; logging calls
are exempt, their extra arguments being the format's values), and no object calls another's private
method. Read from the source (ast)."""

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


def private_calls(source: str) -> list[tuple[int, str]]:
    """(line, callee) of each call of a private method on anything but self, cls or super()."""
    return [(node.lineno, ast.unparse(node.func)) for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("_") and not node.func.attr.startswith("__")
            and ast.unparse(node.func.value) not in ("self", "cls", "super()")]


def test_no_call_in_the_package_passes_more_than_four_bare_arguments():
    offenders = [f"{path.relative_to(PACKAGE)}:{line} {callee}" for path in sorted(PACKAGE.rglob("*.py"))
                 for line, callee in bare_calls(path.read_text())]
    assert not offenders, "name the arguments after the first two:\n" + "\n".join(offenders)


def test_the_check_sees_a_bare_call_and_lets_logging_and_keywords_pass():
    source = ("f(1, 2, 3, 4, 5)\nf(1, 2, c=3, d=4, e=5)\nlog.info('%s %s %s %s', 1, 2, 3, 4)\n"
              "g(*args, 1, 2, 3, 4)\n")
    assert bare_calls(source) == [(1, "f")]


def test_no_object_calls_another_objects_private_method():
    offenders = [f"{path.relative_to(PACKAGE)}:{line} {callee}" for path in sorted(PACKAGE.rglob("*.py"))
                 for line, callee in private_calls(path.read_text())]
    assert not offenders, "a method others call is public:\n" + "\n".join(offenders)


def test_the_check_sees_a_private_call_on_another_object():
    source = "self._a()\nself.pool._b()\ncls._c()\nsuper()._d()\nother.__len__()\n"
    assert private_calls(source) == [(2, "self.pool._b")]
