"""The product packages type-check with mypy, with no error (`make typecheck` runs this test alone).

The installed package is one tree, `gpuyard`, with the repository's services/ and shared/ mapped into it
(setup.py); mypy cannot follow setuptools' mapping, so the check builds that tree of links in a temporary
folder and checks `-p gpuyard` there, with the settings of pyproject.toml's [tool.mypy]. Errors are reported
with the repository's paths."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MAPPED = {"services": "services", "shared": "shared"}  # folder at the root -> sub-package of gpuyard


def gpuyard_tree(where: Path) -> Path:
    """`where/gpuyard`: links to the client's modules and to the mapped folders, as the wheel lays them out."""
    tree = where / "gpuyard"
    tree.mkdir()
    for entry in (ROOT / "gpuyard").iterdir():
        if entry.name != "__pycache__":
            (tree / entry.name).symlink_to(entry)
    for folder, package in MAPPED.items():
        (tree / package).symlink_to(ROOT / folder)
    return where


def repository_paths(output: str) -> str:
    """mypy's lines with the repository's own paths (`gpuyard/shared/x.py` is `shared/x.py`)."""
    for package, folder in MAPPED.items():
        output = output.replace(f"gpuyard/{package}/", f"{folder}/")
    return output


def test_the_tree_has_every_product_module(tmp_path):
    tree = gpuyard_tree(tmp_path) / "gpuyard"
    assert (tree / "shared" / "contracts" / "events" / "jobs.py").is_file()
    assert (tree / "services" / "submit" / "main.py").is_file()
    assert (tree / "cli" / "__init__.py").is_file()
    assert repository_paths("gpuyard/shared/a.py:1: error\ngpuyard/cli/b.py:2: error") == (
        "shared/a.py:1: error\ngpuyard/cli/b.py:2: error"
    )


def test_the_product_type_checks(tmp_path):
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    checked = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "-p",
            "gpuyard",
        ],
        cwd=gpuyard_tree(tmp_path),
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, repository_paths(checked.stdout + checked.stderr)
