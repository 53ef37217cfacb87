"""`gpuyard envs rm` through `gpuyard up`: refused while a job runs in the environment, then done by the node's
executor once none does (its heartbeat no longer lists it, its folder gone)."""

from __future__ import annotations

import pytest

from gpuyard.services.executor.environments.pythons import find_pythons
from tests.tinywheels import make_wheel, offline_settings

from .conftest import Platform, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not find_pythons("/usr/local/bin:/usr/bin"), reason="no system python3.N"),
]


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("environments-rm")
    make_wheel(base / "wheels", "tinypkg")
    env = {**offline_settings(base / "wheels"), "GPUYARD_HEARTBEAT_INTERVAL": "1"}
    p = Platform(base / "data", base / "config", simulate_gpus=2, executors=1, env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def test_an_admin_removes_an_environment_once_no_job_runs_in_it(platform):
    client = platform.client()
    spec = {
        "command": "sleep 600",
        "resources": {"cpus": 0.1, "memory": "100MB"},
        "environment": {"pip": ["tinypkg"]},
    }
    job_id = client.submit(spec).job_id
    platform.wait_state(job_id, {"running"}, timeout=60)
    root = platform.data_dir / "environments"
    [key] = [p.name for p in root.iterdir() if not p.name.startswith(".")]
    wait_for(lambda: "1 " in platform.cli("envs").stdout.split(key, 1)[-1], 30, 0.2, "the env listed in use")
    refused = platform.cli("envs", "rm", key)
    assert refused.returncode == 1 and "in use by running jobs" in refused.stderr, refused.stderr
    client.cancel(job_id)
    platform.wait_state(job_id, {"cancelled"}, timeout=60)
    wait_for(lambda: platform.cli("envs", "rm", key).returncode == 0, 30, 0.5, "the removal taken")
    wait_for(lambda: not (root / key).exists(), 30, 0.2, "the environment deleted on the node")
    wait_for(lambda: key not in platform.cli("envs").stdout, 30, 0.2, "the heartbeat without it")
