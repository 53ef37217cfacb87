"""An install hint works where the user is: from a checkout it names the checkout (`pip install -e
'/path[sim]'`), from a wheel the installed gpuyard (`pip install 'gpuyard[sim]'`), and always this
interpreter's pip. The wheel's side is in test_packaging.py, which builds one."""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from gpuyard.shared.runtime import installhint
from gpuyard.shared.runtime.installhint import install_command, pip_command
from gpuyard.shared.scheduling.sim import cli as sim_cli

ROOT = Path(__file__).resolve().parents[4]
EXTRAS = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
PRODUCT = ("gpuyard", "shared", "services")


def test_from_this_checkout_the_hint_installs_the_checkout_with_the_extra():
    assert installhint.checkout() == ROOT
    assert install_command("sim") == f"{pip_command()} install -e {shlex.quote(f'{ROOT}[sim]')}"
    assert install_command("train", "serving").endswith(f"install -e '{ROOT}[train,serving]'")
    assert install_command().endswith(f"install -e {shlex.quote(str(ROOT))}")


def test_the_pip_named_is_this_interpreters():
    """Run as the user would type it, it is the pip of the environment this code runs in."""
    named = subprocess.run(
        [*shlex.split(pip_command()), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    own = subprocess.run(
        [sys.executable, "-m", "pip", "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert named.stdout.split(" from ")[1] == own.stdout.split(" from ")[1]


def fake_interpreter(folder: Path, *, pip_for: str | None) -> Path:
    """A bin/ folder with `python` (a link to this interpreter) and, unless `pip_for` is None, a `pip` script
    whose #! line names `pip_for` ("self": that python)."""
    folder.mkdir(parents=True)
    python = folder / "python"
    python.symlink_to(sys.executable)
    if pip_for is not None:
        pip = folder / "pip"
        pip.write_text(f"#!{python if pip_for == 'self' else pip_for}\nimport sys\n")
        pip.chmod(0o755)
    return python


@pytest.mark.parametrize(
    ("pip_for", "first_on_path", "expected"),
    [
        ("self", "ours", "pip"),  # a venv activated: plain `pip` is right
        ("self", "another", "{bin}/pip"),  # a venv not activated: `pip` would be another environment's
        ("/usr/bin/python9", "ours", "{bin}/python -m pip"),  # the pip beside it runs another python
        (None, "another", "{bin}/python -m pip"),  # no pip script at all
    ],
)
def test_the_pip_command_is_the_one_of_the_running_interpreter(
    tmp_path, monkeypatch, pip_for, first_on_path, expected
):
    ours = tmp_path / "env" / "bin"
    python = fake_interpreter(ours, pip_for=pip_for)
    another = tmp_path / "other" / "bin"
    fake_interpreter(another, pip_for="self")
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.setenv("PATH", f"{ours if first_on_path == 'ours' else another}{os.pathsep}{another}")
    assert pip_command() == expected.format(bin=ours)


def direct_url_distribution(site: Path, record: dict | None) -> None:
    """An installed gpuyard's metadata in `site`, with `record` as its direct_url.json (PEP 610)."""
    info = site / "gpuyard-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpuyard\nVersion: 0.1.0\n")
    if record is not None:
        (info / "direct_url.json").write_text(json.dumps(record))


@pytest.mark.parametrize(
    ("record", "found"),
    [
        ({"url": "file://{root}", "dir_info": {"editable": True}}, True),  # strict editable mode: a copy
        ({"url": "file://{elsewhere}", "dir_info": {"editable": True}}, False),  # not a checkout (gone)
        ({"url": "file://{root}", "dir_info": {}}, False),  # `pip install .`: a wheel was built and installed
        ({"url": "file:///wheels/gpuyard-0.1.0-py3-none-any.whl", "archive_info": {}}, False),
        (None, False),  # a wheel's files with no record of where they came from
    ],
)
def test_code_run_from_a_copy_finds_the_checkout_an_editable_install_names(
    tmp_path, monkeypatch, record, found
):
    copy = tmp_path / "build" / "__editable__.gpuyard"
    copy.mkdir(parents=True)
    site = tmp_path / "site"
    if record is not None:
        record = {**record, "url": record["url"].format(root=ROOT, elsewhere=tmp_path / "gone")}
    direct_url_distribution(site, record)
    monkeypatch.setattr(installhint, "SOURCE_ROOT", copy)
    monkeypatch.syspath_prepend(str(site))
    assert installhint.checkout() == (ROOT if found else None)
    expected = f"install -e '{ROOT}[sim]'" if found else "install 'gpuyard[sim]'"
    assert install_command("sim").endswith(expected)


def test_the_simulators_plot_hint_is_the_command_for_this_installation(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` fails as when not installed
    assert sim_cli.main(["--plot", str(tmp_path / "out.png")]) == 2  # refused before any trace is read
    assert capsys.readouterr().err == f"gpuyard sim: --plot needs matplotlib: {install_command('sim')}\n"
    assert f"-e '{ROOT}[sim]'" in install_command("sim")


def install_command_calls() -> list[tuple[str, list[str]]]:
    """Every install_command(…) of the product's code: (file:line, the extras it names)."""
    calls = []
    for package in PRODUCT:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "install_command":
                    extras = [a.value for a in node.args if isinstance(a, ast.Constant)]
                    calls.append((f"{path.relative_to(ROOT)}:{node.lineno}", extras))
    return calls


def test_every_hint_names_extras_the_project_has():
    calls = install_command_calls()
    assert calls, "no hint found: the scan is broken"
    unknown = [f"{where}: {extra}" for where, extras in calls for extra in extras if extra not in EXTRAS]
    assert not unknown, "\n".join(unknown)


def spelled_out_pip_commands(path: Path) -> list[int]:
    """Lines of `path` whose string constants (docstrings aside) spell a pip command of their own."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return sorted(
        {
            node.lineno
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and "pip install" in node.value
            and id(node) not in docstrings
        }
    )


def test_no_message_spells_a_pip_command_of_its_own():
    spelled = {
        str(path.relative_to(ROOT)): lines
        for package in PRODUCT
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "shared/runtime/installhint.py" and (lines := spelled_out_pip_commands(path))
    }
    assert not spelled, f"say these through gpuyard.shared.runtime.installhint.install_command: {spelled}"
