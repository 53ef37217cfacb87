"""The Makefile's targets, read with `make -n` (a dry run: nothing is run or installed): the README's two
commands (`make demo`, `make test`) do what they always did, and each target of the daily loop (CONTRIBUTING.md)
runs its command with the project's venv, which it installs first with the test tools, as `make test` does."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.unit.project.test_packaging import ROOT

TEST_EXTRAS = "pip install -q -e '.[platform,test,train,sim,serving]'"
# target -> the commands its recipe runs after the venv's installs, in order, each with BIN for the venv's bin/
DAILY = {
    "lint": ["BIN/ruff check .", "BIN/ruff format --check ."],
    "fmt": ["BIN/ruff check --fix .", "BIN/ruff format ."],
    "typecheck": ["BIN/pytest -q tests/unit/project/test_types.py"],
    "unit": ["BIN/pytest -q -rs tests/unit tests/contract"],
    "integration": ["BIN/pytest -q -rs tests/integration tests/chaos"],
    "browser": ["BIN/pytest -q -rs tests/browser"],
    "docs": [
        "BIN/python -m gpuyard.docsgen.events > docs/events.md.new || { rm -f docs/events.md.new; exit 1; }",
        "mv docs/events.md.new docs/events.md",
        "BIN/python -m gpuyard.docsgen.settings",
        "BIN/python -m gpuyard.docsgen.busdiagram",
        "BIN/python -m gpuyard.docsgen.jscontracts",
    ],
    "bench": [
        "BIN/python benchmarks/pipeline.py --start --jobs 1000 --concurrency 8",
        "BIN/python benchmarks/pipeline.py --start --jobs 300 --concurrency 4 --rate 20",
        "BIN/python benchmarks/scheduler.py --quick --only speed",
    ],
}
# What CI and the README's first lines run: unchanged.
TEST = [
    "BIN/ruff check .",
    "BIN/ruff format --check .",
    "BIN/python tests/suite.py  # two halves side by side (integration and chaos, the rest); each says what it skipped and why",
]


def dry_run(*args: str) -> list[str]:
    """The lines `make -n ARGS` prints (right-stripped), in the repository, free of any make that runs this test
    (`make test` passes its flags down through the environment) and of the variables the Makefile reads."""
    make = shutil.which("make")
    assert make, "make is not installed: the README's first commands need it"
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES", "VENV", "PYTEST_ARGS")
    }
    done = subprocess.run(
        [make, "-n", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"make -n {' '.join(args)} failed:\n{done.stdout}{done.stderr}"
    return [line.rstrip() for line in done.stdout.splitlines()]  # (an empty $(PYTEST_ARGS) leaves a space)


def after_install(lines: list[str], venv: str, *, installs: bool = True) -> list[str]:
    """The recipe's own lines: those after the venv's installs (`touch VENV/bin/.installed-test` the last),
    which must be there unless `installs` is False (a venv already installed and up to date has none)."""
    touched = [i for i, line in enumerate(lines) if line == f"touch {venv}/bin/.installed-test"]
    assert touched or not installs, f"no install of the test tools into {venv}:\n" + "\n".join(lines)
    return lines[touched[-1] + 1 :] if touched else lines


@pytest.fixture
def venv(tmp_path) -> str:
    """A venv that does not exist (yet): every target must make it, and then run from it."""
    return str(tmp_path / "venv")


@pytest.mark.parametrize("target", [*DAILY, "test"])
def test_each_target_installs_the_venv_with_the_test_tools_and_runs_from_it(target, venv):
    lines = dry_run(target, f"VENV={venv}")
    assert lines[0] == f"python3 -m venv {venv}"
    assert f"{venv}/bin/{TEST_EXTRAS}" in lines
    wanted = TEST if target == "test" else DAILY[target]
    assert after_install(lines, venv) == [line.replace("BIN/", f"{venv}/bin/") for line in wanted]


def test_make_test_and_make_demo_run_what_the_readme_says_with_the_usual_venv():
    test = after_install(dry_run("test"), ".venv", installs=False)
    assert test == [line.replace("BIN/", ".venv/bin/") for line in TEST]
    demo = " ".join(dry_run("demo"))
    assert ".venv/bin/gpuyard up --simulate-gpus 4 --demo" in demo
    assert "--port" not in demo  # the usual ports unless PORT=… is given
    assert "--port 8081" in " ".join(dry_run("demo", "PORT=8081"))


def test_pytest_args_reach_pytest(venv):
    lines = dry_run("unit", f"VENV={venv}", "PYTEST_ARGS=-k events -x")
    assert after_install(lines, venv) == [f"{venv}/bin/pytest -q -rs tests/unit tests/contract -k events -x"]


def test_every_target_is_phony():
    """`docs` is also a folder, `bench`… may become one: a phony target runs whatever files are named like it."""
    makefile = (ROOT / "Makefile").read_text()
    phony = {name for line in re.findall(r"^\.PHONY:(.*)$", makefile, re.M) for name in line.split()}
    targets = set(re.findall(r"^([a-z][\w-]*):", makefile, re.M))
    assert {*DAILY, "install", "demo", "test", "test-deep"} <= targets
    assert targets <= phony, targets - phony
