"""A dev environment's replica gets its notebook server's token and port (`jobenv.notebook_env`) on both
backends, the same the submit service's proxy derives (`shared/auth/devtoken.py`); other jobs get neither."""

from __future__ import annotations

import pytest

from gpuyard.services.executor import jobenv
from gpuyard.services.executor.kubernetes.env import replica_env
from gpuyard.services.executor.kubernetes.names import AttemptNames
from gpuyard.shared.auth.devtoken import dev_port, dev_token
from gpuyard.shared.contracts.events.jobs import ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.runtime.installhint import install_command

SECRET = b"s" * 32
DEV = JobSpec.model_validate({"dev": {}})
PLAIN = JobSpec.model_validate({"command": "true"})


@pytest.fixture
def publishing():
    jobenv.configure_publishing(jobenv.Publishing(SECRET, "http://api.test:8080", 3600))
    try:
        yield
    finally:
        jobenv.configure_publishing(None)


def pod_env(spec: JobSpec) -> dict[str, str]:
    listed = replica_env(
        job_id="j1", job_name="nb", tenant="vision", attempt=2, spec=spec,
        placement=ReplicaPlacement(replica=0, node="n1"), names=AttemptNames("gy-j1-2"),
        namespace="jobs", master_port=29500,
    )  # fmt: skip
    return {item["name"]: item["value"] for item in listed}


def test_a_dev_environments_pod_gets_the_token_and_port_the_proxy_derives(publishing):
    env = pod_env(DEV)
    assert env["JUPYTER_TOKEN"] == dev_token(SECRET, "j1", 2)
    assert env["GPUYARD_DEV_PORT"] == str(dev_port(SECRET, "j1", 2))
    assert env["GPUYARD_DEV_INSTALL"] == install_command("dev")
    wanted = ("JUPYTER_TOKEN", "GPUYARD_DEV_PORT", "GPUYARD_DEV_INSTALL")
    assert jobenv.notebook_env(DEV, "j1", 2) == {k: env[k] for k in wanted}


def test_other_jobs_and_a_platform_without_job_tokens_get_none(publishing):
    assert "JUPYTER_TOKEN" not in pod_env(PLAIN) and jobenv.notebook_env(PLAIN, "j1", 2) == {}
    jobenv.configure_publishing(None)
    assert "JUPYTER_TOKEN" not in pod_env(DEV)
