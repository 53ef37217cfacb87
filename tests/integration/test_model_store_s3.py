"""The model store on S3 through the real platform: `gpuyard up` with `GPUYARD_MODEL_STORE=s3://BUCKET/models`
and the standard AWS variables pointing at moto's S3 server on loopback (tests/s3server.py), as a user points it
at MinIO. The CLI publishes a model (the submit service writes its ONNX file to the bucket, nothing to the data
dir), deploys it, and the v2 endpoint answers with it: the serving service read the file from the bucket; then
the model is undeployed, removed, and its object is gone from the bucket."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as triton

from tests.integration.conftest import Platform, platform_on_s3, wait_for
from tests.integration.test_serving import X, infer
from tests.s3server import S3Server
from tests.unit.services.serving.models import Mlp

pytestmark = pytest.mark.integration

MODEL = Mlp(seed=3)
PREFIX = "models"


@pytest.fixture(scope="module")
def on_s3(tmp_path_factory) -> Iterator[tuple[Platform, S3Server, str]]:
    base = tmp_path_factory.mktemp("s3-store")
    with platform_on_s3(base, "GPUYARD_MODEL_STORE", PREFIX) as found:
        yield found


def test_publish_deploy_infer_undeploy_and_remove_with_the_files_on_s3(on_s3, tmp_path):
    platform, server, bucket = on_s3
    api = platform.client()
    path = tmp_path / "mnist.onnx"
    path.write_bytes(MODEL.bytes)

    done = platform.cli("models", "publish", str(path), "--name", "mnist")
    assert done.returncode == 0 and "published mnist version 1" in done.stdout, done.stderr
    [version] = api.model("mnist").versions
    root = f"s3://{bucket}/{PREFIX}/"
    key = version.uri.removeprefix(root)
    assert version.uri.startswith(root) and key.endswith(f"/mnist/1/{version.sha256}.onnx"), version.uri
    assert server.objects(bucket, PREFIX) == {key: len(MODEL.bytes)}
    assert not list(platform.data_dir.rglob("*.onnx"))  # no copy in the data dir yet: the bucket holds it

    done = platform.cli("models", "deploy", "mnist", "--cpus", "0.1", "--memory", "256MB", "--json")
    assert done.returncode == 0, done.stderr
    [job] = json.loads(done.stdout)["jobs"]
    platform.wait_state(job["job_id"], {"running"})
    serving = triton.InferenceServerClient(f"127.0.0.1:{platform.serving_port}")
    headers = {"Authorization": f"Bearer {api.token}"}
    wait_for(lambda: serving.is_model_ready("mnist", headers=headers), 15, what="mnist ready")
    answer = infer(serving, api.token)
    np.testing.assert_allclose(answer.as_numpy("y"), MODEL(X), rtol=1e-5)
    # the serving service read it from the bucket into its cache (the only copy outside the bucket)
    [cached] = platform.data_dir.rglob("*.onnx")
    assert cached.name == f"{version.sha256}.onnx" and cached.read_bytes() == MODEL.bytes

    done = platform.cli("models", "undeploy", "mnist")
    assert done.returncode == 0, done.stderr
    platform.wait_state(job["job_id"], {"cancelled"})
    done = platform.cli("models", "rm", "mnist")
    assert done.returncode == 0 and "removed mnist version 1" in done.stdout, done.stderr
    wait_for(
        lambda: server.objects(bucket, PREFIX) == {}, 15, what="the model's object removed from the bucket"
    )
