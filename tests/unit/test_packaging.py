"""Dependencies: the core installs what the core imports; ONNX Runtime and matplotlib are extras, and the
Makefile's test target installs every extra the tests exercise."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

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


SHIPPED_TRACE = (
    "openb_node_list_gpu_node.csv",
    "openb_pod_list_default.csv",
    "openb_pod_list_gpushare40.csv",
)
TRACE_DATA = "services/scheduler/sim/traces"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel `pip install` would install, built from a copy of the project's own files."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    build = "import sys; from setuptools import build_meta; build_meta.build_wheel(sys.argv[1])"
    subprocess.run([sys.executable, "-c", build, str(out)], cwd=source, check=True, capture_output=True)
    (found,) = out.glob("gpuyard-*.whl")
    return found


def test_the_wheel_ships_the_trace_with_its_license_and_citation(wheel):
    with zipfile.ZipFile(wheel) as archive:
        for name in (*SHIPPED_TRACE, "LICENSE-CC-BY-4.0.txt"):
            assert archive.read(f"{TRACE_DATA}/{name}") == (ROOT / TRACE_DATA / name).read_bytes(), name
        readme = archive.read(f"{TRACE_DATA}/README.md").decode()
    assert "CC BY 4.0" in readme and "@inproceedings" in readme and "alibaba/clusterdata" in readme


def test_the_readme_sim_command_works_from_the_installed_files_alone(wheel, tmp_path):
    """The README's `gpuyard sim --trace openb_pod_list_gpushare40.csv`, run from the wheel's files in a
    folder with no trace beside it (the default node list comes from the package too)."""
    installed = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(installed)
    away = tmp_path / "elsewhere"
    away.mkdir()
    args = ["--trace", "openb_pod_list_gpushare40.csv", "--policy", "bestfit", "--seeds", "1", "--json"]
    run = subprocess.run(
        [sys.executable, "-m", "services.scheduler.sim", *args],
        cwd=away,
        env={**os.environ, "PYTHONPATH": str(installed)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["gpus"] == 6212 and set(result["policies"]) == {"fifo", "bestfit"}
    assert result["policies"]["bestfit"]["pods_mean"] > 8000  # drawn from the gpushare40 file
