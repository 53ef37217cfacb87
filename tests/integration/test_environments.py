"""Jobs' own environments through `gpuyard up` (real NATS, real processes; uv offline from wheels made here): a
job with `environment: {pip: [tinypkg]}` imports it from an environment built on its node, a second job reuses
it (its log says so, nothing is built again), a build that fails fails its job once with `environment_failed`
and uv's last lines, the node announces what it holds and offers (`gpuyard envs`), and a Python version no node
offers is refused at submit with the versions they do."""

from __future__ import annotations

import pytest

from gpuyard.client import ClientError
from gpuyard.services.executor.environments.pythons import find_pythons
from tests.tinywheels import make_wheel, offline_settings

from .conftest import Platform, wait_for

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not find_pythons("/usr/local/bin:/usr/bin"), reason="no system python3.N"),
]

PRINT = 'python -c \'import sys, tinypkg; print("value", tinypkg.VALUE, "prefix", sys.prefix)\''
SMALL = {"cpus": 0.1, "memory": "100MB"}


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("environments")
    make_wheel(base / "wheels", "tinypkg", body="VALUE = 42\n")
    env = {**offline_settings(base / "wheels"), "GPUYARD_HEARTBEAT_INTERVAL": "1"}
    p = Platform(base / "data", base / "config", simulate_gpus=2, executors=1, env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def run(platform: Platform, command: str, environment: dict | None = None):
    client = platform.client()
    spec = {"command": command, "resources": SMALL, **({"environment": environment} if environment else {})}
    job_id = client.submit(spec).job_id
    return platform.wait_state(job_id, {"succeeded", "failed"}, timeout=120), client.logs(job_id)


def test_a_job_runs_in_its_environment_and_the_next_one_reuses_it(platform):
    job, log = run(platform, PRINT, {"pip": ["tinypkg"]})
    assert job.state == "succeeded", (job.message, log)
    root = platform.data_dir / "environments"
    [key] = [p.name for p in root.iterdir() if not p.name.startswith(".")]
    assert f"building environment {key}" in log and f"value 42 prefix {root / key}" in log, log
    again, log = run(platform, PRINT + "; echo VIRTUAL_ENV=$VIRTUAL_ENV", {"pip": ["tinypkg"]})
    assert again.state == "succeeded", (again.message, log)
    assert f"reusing environment {key}" in log and "building environment" not in log, log
    assert f"VIRTUAL_ENV={root / key}" in log
    listed = wait_for(
        lambda: key in (r := platform.cli("envs")).stdout and r, 30, 0.2, "the env in gpuyard envs"
    )
    assert (
        listed.returncode == 0 and "tinypkg" in listed.stdout and "python versions offered" in listed.stdout
    )


def test_a_build_that_fails_fails_the_job_once_with_its_reason(platform):
    job, log = run(platform, "true", {"pip": ["no-such-package"]})
    assert job.state == "failed" and job.failure.reason == "environment_failed", job
    assert "no-such-package" in job.message and "uv pip exited" in job.message
    assert len(job.attempts) == 1 and "no-such-package" in log
    described = platform.cli("describe", job.job_id)
    assert "environment_failed" in described.stdout and "no-such-package" in described.stdout, (
        described.stdout
    )


def test_a_python_no_node_offers_is_refused_at_submit(platform):
    client = platform.client()
    wait_for(lambda: platform.cli("envs").stdout.count("python versions offered"), 30, 0.2, "a heartbeat")
    with pytest.raises(
        ClientError, match=r"needs python 3\.2 for its environment; the nodes offer python 3\."
    ):
        client.submit({"command": "true", "resources": SMALL, "environment": {"pip": ["x"], "python": "3.2"}})
