"""The retention sweep removes the job environments no job used for GPUYARD_ENVIRONMENT_RETENTION, says so in a
line and counts the bytes freed (`gpuyard_retention_freed_bytes_total{what="environments"}`)."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry

from gpuyard.services.executor.environments.builder import USED
from gpuyard.services.executor.environments.node import NodeEnvironments
from gpuyard.services.executor.environments.pythons import find_pythons
from gpuyard.services.executor.retention import JobDirSweeper
from gpuyard.shared.contracts.jobspec import EnvironmentSpec
from gpuyard.shared.settings.environments import EnvironmentSettings
from tests.tinywheels import make_wheel

pytestmark = pytest.mark.skipif(not find_pythons("/usr/local/bin:/usr/bin"), reason="no system python3.N")


async def test_an_unused_environment_is_removed_said_and_counted(tmp_path, caplog):
    make_wheel(tmp_path / "wheels", "tinypkg")
    settings = EnvironmentSettings(
        environment_find_links=str(tmp_path / "wheels"), environment_offline=True, environment_retention="7d"
    )
    envs = NodeEnvironments(tmp_path / "envs", settings, "node-a")
    envs.open()
    old = await envs.ensure(EnvironmentSpec(pip=["tinypkg"]), (("j1", 1), 0), lambda _: None)
    kept = await envs.ensure(EnvironmentSpec(python=old.python), (("j2", 1), 0), lambda _: None)
    envs.release((("j1", 1), 0))
    envs.release((("j2", 1), 0))
    then = (datetime.now(UTC) - timedelta(days=8)).timestamp()
    os.utime(old.path / USED, (then, then))
    registry = CollectorRegistry()
    sweeper = JobDirSweeper(tmp_path / "data", None, [], 0, registry=registry, environments=envs)
    with caplog.at_level(logging.INFO):
        removed = await sweeper.sweep_environments()
    assert [key for key, _ in removed] == [old.key] and not old.path.exists() and kept.path.exists()
    freed = registry.get_sample_value("gpuyard_retention_freed_bytes_total", {"what": "environments"})
    assert freed == removed[0][1] > 0
    assert f"removed environment {old.key}" in caplog.text and "freed" in caplog.text
