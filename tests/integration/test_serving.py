"""Serving through the real platform (`gpuyard up`): publish a model from the CLI, deploy it on a quarter of a
GPU, infer through tritonclient (binary and JSON) with the API's bearer token, see the replica in `gpuyard ps`
with its share, load it again after the serving service is killed and restarted (nothing recorded twice),
reach it through one hop from a second node's serving service, refuse another tenant, roll out v2 without failing a request in flight, refuse a broken v3 (its job fails with
the reason while v2 serves), then undeploy: the replicas are cancelled and their GPUs freed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from gpuyard.shared.contracts.reasons import PendingCode
from tests.integration.conftest import free_port, wait_for
from tests.integration.processes import service_processes
from tests.unit.services.serving.models import Mlp, unloadable

pytestmark = pytest.mark.integration

V1, V2 = Mlp(seed=1), Mlp(seed=2)
X = np.arange(8, dtype=np.float32).reshape(2, 4) / 8


def infer(client: triton.InferenceServerClient, token: str, *, binary: bool = True, version: str = ""):
    given = triton.InferInput("x", list(X.shape), "FP32")
    given.set_data_from_numpy(X, binary_data=binary)
    wanted = [triton.InferRequestedOutput("y", binary_data=binary)]
    return client.infer(
        "mnist", [given], model_version=version, outputs=wanted, headers={"Authorization": f"Bearer {token}"}
    )


def answers(client: triton.InferenceServerClient, token: str) -> bool:
    try:
        return infer(client, token).get_response()["model_version"] == "1"
    except Exception:
        return False


def test_publish_deploy_infer_roll_out_refuse_a_broken_version_and_undeploy(platform, tmp_path):
    api = platform.client()
    token = api.token

    def publish(data: bytes, version: int) -> None:
        path = tmp_path / f"v{version}.onnx"
        path.write_bytes(data)
        done = platform.cli("models", "publish", str(path), "--name", "mnist")
        assert done.returncode == 0 and f"published mnist version {version}" in done.stdout, done.stderr

    def deploy(what: str) -> str:
        done = platform.cli(
            "models", "deploy", what, "--gpus", "0.25", "--cpus", "0.1", "--memory", "256MB", "--json"
        )
        assert done.returncode == 0, done.stderr
        [job] = json.loads(done.stdout)["jobs"]
        return job["job_id"]

    serving = triton.InferenceServerClient(f"127.0.0.1:{platform.serving_port}")
    publish(V1.bytes, 1)
    v1_job = deploy("mnist")
    platform.wait_state(v1_job, {"running"})
    wait_for(
        lambda: serving.is_model_ready("mnist", headers={"Authorization": f"Bearer {token}"}),
        15,
        what="mnist ready on the serving port",
    )
    for binary in (True, False):
        answer = infer(serving, token, binary=binary)
        np.testing.assert_allclose(answer.as_numpy("y"), V1(X), rtol=1e-5)
        assert answer.get_response()["model_version"] == "1"
    ps = platform.cli("ps")
    assert ps.returncode == 0 and "mnist:1" in ps.stdout and "0.25" in ps.stdout, ps.stdout
    assert "CPUExecutionProvider" in api.job(v1_job).attempts[-1].notes[0]

    # the serving service dies: `gpuyard up` starts it again, and it loads what runs on its node again
    [serving_pid] = service_processes(platform.proc.pid, "serving")
    os.kill(serving_pid, signal.SIGKILL)
    wait_for(lambda: answers(serving, token), 30, 0.2, "the restarted serving service to answer")
    again = api.job(v1_job)
    assert again.state == "running" and again.attempt == 1 and len(again.attempts) == 1
    kinds = [e.event["type"].rsplit(".", 1)[-1] for e in api.events(v1_job)]
    assert kinds == ["submitted", "placed", "started"], kinds

    # another node's serving service holds no replica: it learned where v1 is and forwards, one hop
    node_b = free_port()
    env = {
        **platform.joining_env("serving"),
        "GPUYARD_NODE_NAME": "node-b",
        "GPUYARD_SERVING_PORT": str(node_b),
        "GPUYARD_TOKENS_FILE": str(platform.data_dir / "tokens.json"),
    }
    log = (tmp_path / "node-b.log").open("wb")
    second = subprocess.Popen(
        [sys.executable, "-m", "gpuyard.services.serving"], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        via_b = triton.InferenceServerClient(f"127.0.0.1:{node_b}")
        wait_for(lambda: answers(via_b, token), 30, 0.2, "node-b's serving service to forward")
        np.testing.assert_allclose(infer(via_b, token, binary=False).as_numpy("y"), V1(X), rtol=1e-5)
    finally:
        second.terminate()
        second.wait(20)
        log.close()

    other = platform.cli("admin", "tokens", "create", "--tenant", "other")
    assert other.returncode == 0, other.stderr
    with pytest.raises(InferenceServerException, match="unknown model 'mnist'"):
        infer(serving, other.stdout.strip())
    with pytest.raises(InferenceServerException, match="unknown or revoked token"):
        infer(serving, "not-a-token")

    # v2 goes live while requests keep coming: none fails, and the default moves to v2 once it is ready
    failures: list[str] = []
    versions: set[str] = set()
    stop = threading.Event()

    def keep_asking() -> None:
        client = triton.InferenceServerClient(f"127.0.0.1:{platform.serving_port}")
        while not stop.is_set():
            try:
                versions.add(infer(client, token).get_response()["model_version"])
            except Exception as exc:
                failures.append(repr(exc))

    asking = threading.Thread(target=keep_asking, daemon=True)
    asking.start()
    try:
        publish(V2.bytes, 2)
        v2_job = deploy("mnist:2")
        platform.wait_state(v2_job, {"running"})
        wait_for(lambda: "2" in versions, 15, what="requests answered by v2")
    finally:
        stop.set()
        asking.join(10)
    assert failures == [] and versions <= {"1", "2"}
    np.testing.assert_allclose(infer(serving, token).as_numpy("y"), V2(X), rtol=1e-5)
    assert infer(serving, token, version="1").get_response()["model_version"] == "1"

    # a broken v3: its replica fails at once with the reason, and v2 keeps serving
    publish(unloadable(), 3)
    v3_job = deploy("mnist:3")
    failed = platform.wait_state(v3_job, {"failed"})
    assert failed.failure.reason == "start_failed" and "invalid_model" in failed.failure.message, failed
    assert len(failed.attempts) == 1  # never retried
    assert infer(serving, token).get_response()["model_version"] == "2"

    # undeploy: the replicas are cancelled, their GPU shares go back (a job needing both GPUs runs)
    whole = api.submit(
        {
            "command": ["true"],
            "resources": {"gpus": 2, "cpus": 0.1, "memory": "256MB"},
            "name": "after-undeploy",
        }
    ).job_id
    waiting = wait_for(  # the scheduler has judged it: the replicas' shares keep it waiting
        lambda: (job := api.job(whole)).pending and job, 30, what="the scheduler's reason it waits"
    )
    assert waiting.state == "queued" and waiting.pending.code == PendingCode.INSUFFICIENT_GPUS, (
        waiting.pending
    )
    done = platform.cli("models", "undeploy", "mnist")
    assert done.returncode == 0, done.stderr
    for job in (v1_job, v2_job):
        platform.wait_state(job, {"cancelled"})
    assert platform.wait_state(whole, {"succeeded"}).state == "succeeded"
    with pytest.raises(InferenceServerException):
        infer(serving, token)
