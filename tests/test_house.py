"""The house's rules that import-linter does not check: room sizes and imports hidden in
functions (docs/architecture.md)."""

from __future__ import annotations

import ast
import gc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450


@contextmanager
def _collector_held_off() -> Iterator[None]:
    """No garbage collection while the block parses. CPython 3.11 keeps one AST recursion
    depth per interpreter (python/cpython#106905): a finaliser that the collector runs in the
    middle of a parse, and that formats a traceback (3.11's carets parse the line with `ast`),
    makes the outer parse fail with "SystemError: AST constructor recursion depth mismatch".
    It did, in the suite, when an earlier test's leftover coroutine was collected here. One
    collection before, not one per file: a collection of a worker's heap costs ~0.2 s."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _python_modules() -> list[Path]:
    return sorted(
        path
        for folder in ("chat", "chatsite")
        for path in (ROOT / folder).rglob("*.py")
        if "migrations" not in path.parts
    )


def test_no_python_module_or_page_script_is_over_450_lines() -> None:
    scripts = sorted((ROOT / "static" / "chat").glob("*.js"))
    too_long = {
        str(path.relative_to(ROOT)): lines
        for path in [*_python_modules(), *scripts]
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not too_long, f"split these rooms: {too_long}"


def test_imports_inside_functions_are_few_and_each_says_why() -> None:
    """An import inside a function hides a circle from a reader (and from the contracts'
    reader too, when it is not made). Allowed: AppConfig.ready, and at most four others, each
    with a comment right above or on its line saying why."""
    hidden: list[str] = []
    unexplained: list[str] = []
    with _collector_held_off():
        trees = {path: ast.parse(path.read_text(encoding="utf-8")) for path in _python_modules()}
    for path, tree in trees.items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if function.name == "ready" and path.name == "apps.py":
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import | ast.ImportFrom):
                    where = f"{path.relative_to(ROOT)}:{node.lineno}"
                    hidden.append(where)
                    around = lines[node.lineno - 2 : node.lineno]
                    if not any("#" in line for line in around):
                        unexplained.append(where)
    assert len(hidden) <= 4, hidden
    assert not unexplained, f"say why each of these is inside a function: {unexplained}"
