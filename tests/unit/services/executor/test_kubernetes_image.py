"""A job's own image on the Kubernetes backend (`environment: {image: ...}`): its pods run it, schema-valid;
a job without one runs the platform's image (GPUYARD_KUBERNETES_IMAGE); packages to build fail to start there
(no pod made), saying to give an image."""

from __future__ import annotations

from gpuyard.shared.settings.kubernetes import KubernetesConfig
from tests.unit.services.executor.fake_kube_api import FakeKubeApi
from tests.unit.services.executor.test_executor_kubernetes import k8s_executor
from tests.unit.services.executor.test_kubernetes_manifests import assert_valid, render

IMAGE = "registry.example.com/team/pytorch:2.4.0-cuda12.1@sha256:" + "a" * 64


def test_the_job_s_image_is_its_pods_image():
    config = KubernetesConfig(namespace="jobs", image="gpuyard/gpuyard:latest")
    spec = {
        "command": "python train.py",
        "resources": {"gpus": 1},
        "replicas": 2,
        "environment": {"image": IMAGE},
    }
    manifests = render(spec, config=config, gpus=1)
    assert_valid(manifests)
    assert {pod["spec"]["containers"][0]["image"] for pod in manifests.pods} == {IMAGE}


def test_without_one_the_pods_run_the_platform_s_image():
    config = KubernetesConfig(namespace="jobs", image="gpuyard/gpuyard:latest")
    (pod,) = render({"command": "true"}, config=config).pods
    assert pod["spec"]["containers"][0]["image"] == "gpuyard/gpuyard:latest"


async def test_packages_to_build_fail_to_start_on_the_kubernetes_backend(h):
    api = FakeKubeApi(namespace="jobs")
    ex = await k8s_executor(h, api)
    job = await h.submit(command="true", environment={"pip": ["numpy"]})
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed" and "builds no Python environment" in view.message
    assert api.pods == {}  # (no pod made)
