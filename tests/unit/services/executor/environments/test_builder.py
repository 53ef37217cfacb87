"""Building job environments with uv, offline from wheels made here: a build, its reuse, one build per key at
a time, the rename into place once whole, a failure with uv's last lines, removal and the retention sweep."""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuyard.services.executor.environments.builder import BUILDING, META, USED, BuildFailed
from gpuyard.services.executor.environments.catalog import held_environments
from gpuyard.services.executor.environments.node import InUse, NodeEnvironments
from gpuyard.services.executor.environments.pythons import default_python, find_pythons
from gpuyard.shared.contracts.jobspec import EnvironmentSpec
from gpuyard.shared.settings.environments import EnvironmentSettings
from tests.tinywheels import make_wheel

PYTHONS = "/usr/local/bin:/usr/bin"
pytestmark = pytest.mark.skipif(not find_pythons(PYTHONS), reason="no system python3.N to build from")


def settings(wheels: Path, **more) -> EnvironmentSettings:
    return EnvironmentSettings(
        environment_find_links=str(wheels), environment_offline=True, environment_pythons_path=PYTHONS, **more
    )


@pytest.fixture
def wheels(tmp_path: Path) -> Path:
    folder = tmp_path / "wheels"
    make_wheel(folder, "tinypkg", body="VALUE = 42\n")
    make_wheel(folder, "otherpkg")
    return folder


@pytest.fixture
def node(tmp_path: Path, wheels: Path) -> NodeEnvironments:
    envs = NodeEnvironments(tmp_path / "envs", settings(wheels), "node-a")
    envs.open()
    return envs


def spec(*pip: str, python: str | None = None) -> EnvironmentSpec:
    return EnvironmentSpec(pip=list(pip), python=python)


class Out:
    def __init__(self) -> None:
        self.data = b""

    def __call__(self, chunk: bytes) -> None:
        self.data += chunk

    @property
    def text(self) -> str:
        return self.data.decode()


async def test_a_build_installs_the_packages_and_a_second_use_reuses_it(node: NodeEnvironments):
    first, again = Out(), Out()
    built = await node.ensure(spec("tinypkg"), (("job1", 1), 0), first)
    assert not built.reused and built.path == node.root / built.key
    assert f"building environment {built.key}" in first.text and "tinypkg" in first.text
    proc = await asyncio.create_subprocess_exec(
        built.path / "bin" / "python",
        "-c",
        "import sys, tinypkg; print(tinypkg.VALUE, sys.prefix)",
        stdout=asyncio.subprocess.PIPE,
    )
    stdout, _ = await proc.communicate()
    assert proc.returncode == 0 and stdout.decode().split() == ["42", str(built.path)]
    [announced] = node.announced()
    first_used = announced.last_used
    reused = await node.ensure(spec(" tinypkg "), (("job2", 1), 0), again)  # (the same, whitespace aside)
    assert reused.reused and reused.key == built.key
    assert f"reusing environment {built.key}" in again.text and "building" not in again.text
    [held] = node.announced()
    assert (held.key, held.packages, held.in_use) == (built.key, "tinypkg", 2)
    assert held.size_bytes > 0 and held.last_used >= first_used


async def test_jobs_that_want_one_environment_at_once_wait_for_one_build(node: NodeEnvironments):
    outs = [Out() for _ in range(3)]
    built = await asyncio.gather(
        *(node.ensure(spec("tinypkg"), ((f"j{i}", 1), 0), o) for i, o in enumerate(outs))
    )
    assert sum(not b.reused for b in built) == 1 and len({b.key for b in built}) == 1
    assert sum("building environment" in o.text for o in outs) == 1


async def test_the_key_follows_the_packages_their_order_and_the_index(tmp_path: Path, wheels: Path):
    envs = NodeEnvironments(tmp_path / "e", settings(wheels), "n")
    envs.open()
    python = default_python(envs.pythons)
    key = envs.builder.key_of
    assert key(spec("a", "b"), python) != key(spec("b", "a"), python)
    assert key(spec("a==1"), python) == key(spec("a == 1"), python)
    other = NodeEnvironments(tmp_path / "e", settings(wheels, environment_index_url="https://x/simple"), "n")
    assert other.builder.key_of(spec("a"), python) != key(spec("a"), python)


async def test_a_failed_build_leaves_nothing_and_says_uv_s_last_lines(node: NodeEnvironments):
    out = Out()
    with pytest.raises(BuildFailed) as failed:
        await node.ensure(spec("no-such-package"), (("job", 1), 0), out)
    assert "uv pip exited" in failed.value.message
    assert any("no-such-package" in line for line in failed.value.tail)
    assert "no-such-package" in out.text  # (its output went to the job's log as it came)
    assert not [p for p in node.root.iterdir() if not p.name.startswith(".")]
    assert not list(node.root.glob(f"{BUILDING}*")) and node.announced() == []
    assert node.marks.used() == {}  # (nothing counted as used)


async def test_a_half_build_is_never_taken_for_a_whole_one(node: NodeEnvironments):
    python = default_python(node.pythons)
    key = node.builder.key_of(spec("tinypkg"), python)
    half = node.root / f"{BUILDING}{key}-dead"  # (an executor killed while building)
    (half / "bin").mkdir(parents=True)
    built = await node.ensure(spec("tinypkg"), (("job", 1), 0), Out())
    assert not built.reused and (built.path / META).is_file() and not half.exists()


async def test_a_python_the_node_does_not_offer_fails_with_what_it_offers(node: NodeEnvironments):
    with pytest.raises(BuildFailed, match=r"offers no python 3\.2 .*it offers: "):
        await node.ensure(spec("tinypkg", python="3.2"), (("job", 1), 0), Out())


async def test_removal_is_refused_while_in_use_and_the_sweep_spares_used_ones(node: NodeEnvironments):
    user = (("job", 1), 0)
    built = await node.ensure(spec("tinypkg"), user, Out())
    with pytest.raises(InUse):
        await node.remove(built.key)
    later = datetime.now(UTC) + timedelta(days=30)
    assert await node.sweep(later) == []  # (in use)
    node.release(user)
    old = (datetime.now(UTC) - timedelta(days=20)).timestamp()
    os.utime(built.path / USED, (old, old))
    assert await node.sweep() and not built.path.exists()
    assert held_environments(node.root) == [] and node.announced() == []
    assert await node.remove(built.key) is None  # (gone: nothing to remove)


async def test_a_replica_of_another_executor_process_keeps_it_too(tmp_path: Path, wheels: Path):
    """Two executor processes of one node (executor_workers: 2) share the root: one's running replica keeps
    the environment from the other's removal; a mark whose replica is gone (no pid file) goes once it is old."""
    ours = NodeEnvironments(tmp_path / "envs", settings(wheels), "node-a")
    theirs = NodeEnvironments(tmp_path / "envs", settings(wheels), "node-a", alive=lambda *_: False)
    ours.open()
    theirs.open()
    built = await ours.ensure(spec("tinypkg"), (("job", 1), 0), Out())
    with pytest.raises(InUse):
        await theirs.remove(built.key)
    assert [e.in_use for e in theirs.announced()] == [1]
    mark = next((tmp_path / "envs" / ".in-use" / built.key).iterdir())
    old = mark.stat().st_mtime - 3600
    os.utime(mark, (old, old))  # (its executor stopped, its replica ended meanwhile: its pid file gone)
    assert await theirs.remove(built.key) and not built.path.exists()
