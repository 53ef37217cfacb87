"""`pip install gpuyard` is the client: in a fresh environment that holds only the wheel and the distributions its
own dependencies need (none of the `platform` extra), `gpuyard --version` and `gpuyard ps --server …` work against
a real API, `gpuyard.client` imports no server package, and `gpuyard up` says in one line what to install.

The environment is made offline: a new venv, the project's wheel installed into it by pip, and each distribution
of the dependencies' closure linked from this environment (what pip would fetch from the registry)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.unit.project.test_packaging import ROOT, wheel  # noqa: F401 (the wheel fixture)
from tests.unit.services.submit.submitctx import submit_app, submit_context
from tests.unit.services.submit.test_stream_revocation import served

SERVER_PACKAGES = ("nats", "fastapi", "starlette", "uvicorn", "pymongo", "kubernetes", "onnx", "numpy")


def closure(requirements: list[str]) -> set[str]:
    """The distributions `requirements` need, theirs included, as pip would install them here (markers
    evaluated, no extras)."""
    found: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = importlib.metadata.distribution(req.name).metadata["Name"]
        if name.lower() in found:
            continue
        found.add(name.lower())
        todo += [Requirement(r) for r in importlib.metadata.requires(name) or []]
    return found


def link_distribution(name: str, site: Path) -> None:
    """What installing `name` put in site-packages (its modules, its metadata), linked into `site`."""
    dist = importlib.metadata.distribution(name)
    tops = {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    for top in tops - {"__pycache__"}:
        source = Path(dist.locate_file(top))
        if source.exists() and not (site / top).exists():
            (site / top).symlink_to(source)


@pytest.fixture(scope="module")
def client_env(wheel, tmp_path_factory) -> Path:  # noqa: F811
    """A venv with the wheel and the closure of the project's own dependencies only; its bin folder."""
    venv = tmp_path_factory.mktemp("client") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    [site] = venv.glob("lib/python3*/site-packages")
    dependencies = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    for name in closure(dependencies):
        link_distribution(name, site)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    subprocess.run([*pip, "--no-deps", "--no-index", str(wheel)], check=True, capture_output=True)
    return venv / "bin"


def test_the_client_installs_without_the_platforms_packages():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = closure(project["dependencies"])
    assert not {"nats-py", "fastapi", "uvicorn", "pymongo", "kubernetes", "onnx", "numpy"} & needed
    assert {"nats-py", "fastapi", "pymongo", "numpy"} <= {
        Requirement(r).name.lower() for r in project["optional-dependencies"]["platform"]
    }


def test_the_cli_and_the_client_run_with_the_clients_dependencies_alone(client_env, tmp_path):
    run = lambda *argv: subprocess.run(  # noqa: E731
        argv, cwd=tmp_path, capture_output=True, text=True, timeout=120, env={"HOME": str(tmp_path)}
    )
    version = run(str(client_env / "gpuyard"), "--version")
    assert version.returncode == 0 and version.stdout.startswith("gpuyard "), version.stderr
    for package in SERVER_PACKAGES:  # (none of them is there to be imported by chance)
        assert run(str(client_env / "python"), "-c", f"import {package}").returncode == 1, package
    imported = run(
        str(client_env / "python"),
        "-c",
        "import sys, gpuyard, gpuyard.client, gpuyard.cli; print(sorted({m.split('.')[0] for m in sys.modules}))",
    )
    assert imported.returncode == 0, imported.stderr
    assert not set(SERVER_PACKAGES) & set(re.findall(r"'(\w+)'", imported.stdout))
    with submit_context(tmp_path / "api") as ctx, served(submit_app(ctx)) as server:
        listed = run(str(client_env / "gpuyard"), "ps", "--server", server, "--token", "tok-vision", "--all")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.strip() == "no jobs", listed.stdout
    up = run(str(client_env / "gpuyard"), "up")
    assert up.returncode == 1 and len(up.stderr.strip().splitlines()) == 1, up.stderr
    assert "only the client" in up.stderr and "install 'gpuyard[platform]'" in up.stderr, up.stderr
