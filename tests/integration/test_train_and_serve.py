"""The train-and-serve example through the real platform (`gpuyard up`): its job trains a PyTorch model on data
it makes, exports ONNX, publishes and deploys it from inside the job with the job's own token; once the job has
succeeded and the replica runs, tritonclient's answers on the serving port match the PyTorch model's own
outputs, and so does the example's infer.py; undeploy frees the replica."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.integration.conftest import wait_for

pytest.importorskip("torch")
import torch  # noqa: E402
import tritonclient.http as triton  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train-and-serve"


def example_module():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import train
    finally:
        sys.path.remove(str(EXAMPLE))
    return train


def test_the_example_trains_publishes_deploys_and_serves_what_pytorch_answers(platform, tmp_path):
    spec = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    out = tmp_path / "out"
    command = spec["command"]
    command[command.index("--out") + 1] = str(out)  # the only change: where it writes (not the checkout)
    api = platform.client()
    job = api.submit(spec).job_id
    done = platform.wait_state(job, {"succeeded", "failed", "cancelled"}, 240)
    logs = api.logs(job)
    assert done.state == "succeeded", logs
    assert "held-out accuracy" in logs and "published blobs version 1" in logs and "deploying blobs:1" in logs

    def replica_running():
        replicas = api.request("GET", "/v1/models/blobs/deployments")["replicas"]
        return bool(replicas) and replicas[0]["state"] == "running" and replicas[0]

    replica = wait_for(replica_running, 60, 0.2, "the blobs replica running")
    assert replica["gpus"] == 0.25 and replica["node"] == "node-a"

    train = example_module()
    model = train.make_model()
    model.load_state_dict(torch.load(out / "model.pt"))
    model.eval()
    points = torch.randn(5, train.FEATURES)
    with torch.no_grad():
        expected = model(points).numpy()
    serving = triton.InferenceServerClient(f"127.0.0.1:{platform.serving_port}")
    headers = {"Authorization": f"Bearer {api.token}"}
    wait_for(lambda: serving.is_model_ready("blobs", headers=headers), 30, 0.2, "blobs ready")
    for binary in (True, False):
        given = triton.InferInput(train.INPUT, list(points.shape), "FP32")
        given.set_data_from_numpy(points.numpy(), binary_data=binary)
        answer = serving.infer("blobs", [given], headers=dict(headers))  # (tritonclient adds to it)
        np.testing.assert_allclose(answer.as_numpy(train.OUTPUT), expected, rtol=1e-4, atol=1e-5)

    env = {**platform.env, "GPUYARD_SERVER": platform.server}
    asked = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE / "infer.py"),
            "--url",
            f"127.0.0.1:{platform.serving_port}",
            "--out",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert asked.returncode == 0, asked.stdout + asked.stderr
    assert "the served answers match PyTorch's" in asked.stdout
    accuracy = float(asked.stdout.split("accuracy ")[1].split(";")[0])
    assert accuracy >= 0.75, asked.stdout  # it learned: 4 classes, a quarter by chance

    undeploy = platform.cli("models", "undeploy", "blobs")
    assert undeploy.returncode == 0, undeploy.stderr
    platform.wait_state(replica["job_id"], {"cancelled"}, 30)
