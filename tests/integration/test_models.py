"""Publishing models through the real platform (`gpuyard up`): the CLI publishes, lists and describes; a
training job publishes from inside with the token the executor gave it (and that token opens nothing else), from
a working directory with packages of its own named `shared` and `services`;
`model.published` goes out on the bus with the producing job."""

from __future__ import annotations

import asyncio
import json
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.subjects import Wildcard
from tests.integration.test_bus_auth import eventually
from tests.unit.services.submit.onnxmodels import tiny_model

pytestmark = pytest.mark.integration

JOB_SCRIPT = textwrap.dedent(
    """
    import os

    import httpx
    import onnx
    from onnx import TensorProto, helper

    import gpuyard

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, "model.onnx")
    done = gpuyard.publish_model("model.onnx", name="from-job")
    print("published", done.name, done.version, done.job_id, flush=True)
    server, token = os.environ["GPUYARD_SERVER"], os.environ["GPUYARD_PUBLISH_TOKEN"]
    other = httpx.get(server + "/v1/jobs", headers={"Authorization": "Bearer " + token})
    print("jobs with the publish token:", other.status_code, flush=True)
    """
)


def shadow_platform_packages(folder: Path) -> None:
    """Packages of its own named `shared` and `services` in `folder`, as a training repository may have, which
    break whoever imports them in GPUYard's place."""
    for name in ("shared", "services"):
        (folder / name).mkdir()
        (folder / name / "__init__.py").write_text(
            f"raise ImportError('the repository's own {name} package')\n"
        )
        (folder / name / "api.py").write_text("")


def test_publish_from_the_cli_and_from_inside_a_job_with_the_event_on_the_bus(platform, tmp_path):
    secret = platform.data_dir / "secrets" / "publish.key"
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600  # made by `gpuyard up`
    seen: list[CloudEvent] = []

    async def run() -> str:
        integrator = await platform.bus("integrator")

        async def on_msg(msg) -> None:
            seen.append(CloudEvent.from_json(msg.data))

        try:
            await integrator.subscribe(Wildcard.MODEL.value, on_msg)
            await integrator.nc.flush()
            path = tmp_path / "model.onnx"
            path.write_bytes(tiny_model())
            shadow_platform_packages(tmp_path)  # the job's working directory, a training repository's
            published = await asyncio.to_thread(
                platform.cli, "models", "publish", str(path), "--name", "cli-model"
            )
            assert published.returncode == 0, published.stderr
            assert "published cli-model version 1" in published.stdout
            client = platform.client()
            job = client.submit(
                {
                    "command": [sys.executable, "-c", JOB_SCRIPT],
                    "working_dir": str(tmp_path),
                    "name": "publisher",
                }
            ).job_id
            done = await asyncio.to_thread(platform.wait_state, job, {"succeeded", "failed"}, 60)
            logs = client.logs(job)
            assert done.state == "succeeded", logs
            assert f"published from-job 1 {job}" in logs
            assert "jobs with the publish token: 401" in logs
            await eventually(
                lambda: {e.data.name for e in seen} >= {"cli-model", "from-job"}, what="both model.published"
            )
            return job
        finally:
            await integrator.close()

    job = asyncio.run(run())
    by_name = {e.data.name: e for e in seen}
    assert by_name["from-job"].type == "io.gpuyard.model.published"
    assert by_name["from-job"].data.job_id == job and by_name["from-job"].data.tenant == "default"
    assert by_name["from-job"].data.inputs[0].shape == [-1, 4]
    assert by_name["cli-model"].data.job_id is None and by_name["cli-model"].data.user == "admin"
    listed = platform.cli("models", "ls", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {(m["name"], m["latest"]) for m in json.loads(listed.stdout)} == {
        ("cli-model", 1),
        ("from-job", 1),
    }
    described = platform.cli("models", "describe", "from-job")
    assert (
        described.returncode == 0
        and f"by job {job}" in described.stdout
        and "x FP32[-1,4]" in described.stdout
    )
    model = platform.client().model("from-job")
    assert model.versions[0].uri.startswith(str(platform.data_dir / "models" / "default" / "from-job" / "1"))
