"""Dependencies: the core installs what the core imports; ONNX Runtime and matplotlib are extras, and the
Makefile's test target installs every extra the tests exercise."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PACKAGES = ("gpuyard", "shared", "services")


def names(requirements: list[str]) -> set[str]:
    return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements}


def imports_of(module: str) -> dict[Path, list[ast.AST]]:
    """Where the project's packages import `module` (or a submodule): file -> the import statements."""
    found: dict[Path, list[ast.AST]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                targets = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom) and not node.level
                    else []
                )
                if any(t == module or t.startswith(f"{module}.") for t in targets):
                    found.setdefault(path.relative_to(ROOT), []).append(node)
    return found


def test_onnx_runtime_and_matplotlib_are_extras_not_core():
    extras = {name: names(reqs) for name, reqs in PROJECT["optional-dependencies"].items()}
    assert not {"onnxruntime", "onnxruntime-gpu", "matplotlib"} & names(PROJECT["dependencies"])
    assert extras["serving"] == {"onnxruntime"} and extras["gpu"] == {"onnxruntime-gpu"}
    assert extras["sim"] == {"matplotlib"}
    for path, nodes in imports_of("onnxruntime").items():  # where the core uses it, only when it serves
        assert not any(node in ast.parse((ROOT / path).read_text()).body for node in nodes), path


def test_matplotlib_is_imported_only_when_the_simulator_plots():
    found = imports_of("matplotlib")
    assert set(found) == {Path("services/scheduler/sim/cli.py")}
    tree = ast.parse((ROOT / "services/scheduler/sim/cli.py").read_text())
    assert not any(
        node in tree.body for node in found[Path("services/scheduler/sim/cli.py")]
    )  # in a function


def test_make_test_installs_the_extras_the_tests_use():
    makefile = (ROOT / "Makefile").read_text()
    installs = re.findall(r"pip install -q -e '\.\[([a-z,]+)\]'", makefile)
    assert installs and set(installs[0].split(",")) == {"test", "train", "sim", "serving"}
    assert set(installs[0].split(",")) <= set(PROJECT["optional-dependencies"])
