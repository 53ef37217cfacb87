"""No catch-all modules: every product module stays under 600 lines and every function under 80 (ruff holds
their complexity to 15: C901 in pyproject.toml). A module or function that grows past them is split by what
it does, not given an exception."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = sorted(p for top in ("gpuyard", "services", "shared") for p in (ROOT / top).rglob("*.py"))
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def long_functions(source: str) -> list[str]:
    """Each function (or method) of `source` longer than MAX_FUNCTION_LINES, decorators and docstring included."""
    return [
        f"{node.name} (line {node.lineno}): {node.end_lineno - node.lineno + 1} lines"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    ]


def test_the_check_finds_a_long_function_at_any_depth():
    body = "".join(f"        x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    source = f"def short():\n    return 1\n\nclass A:\n    async def long(self):\n{body}"
    assert long_functions(source) == [f"long (line 5): {MAX_FUNCTION_LINES + 1} lines"]


@pytest.mark.parametrize("path", PRODUCT, ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_and_function_stays_small(path):
    source = path.read_text()
    lines = source.count("\n")
    assert lines <= MAX_MODULE_LINES, f"{lines} lines: split it by what it does"
    assert long_functions(source) == []
