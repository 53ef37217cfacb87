"""ClientKubeApi over a stand-in for the client's CoreV1Api (no API server): the requests it makes, the
dicts it returns and how it translates the client's ApiException."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from services.executor.kubernetes.api import KubeAlreadyExists, KubeApiError, KubeNotFound
from services.executor.kubernetes.client_api import ClientKubeApi

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "p0", "labels": {"a": "b"}},
    "spec": {
        "containers": [{"name": "worker", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    },
}


class StubCore:
    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.pods = [
            k8s.V1Pod.from_dict({**POD, "status": {"phase": "Running", "startTime": "2025-05-01T12:00:00Z"}})
        ]

    def create_namespaced_pod(self, namespace, body):
        self.calls.append(("create_pod", namespace, body))
        if body.metadata.name == "taken":
            raise ApiException(status=409, reason="Conflict")
        return body

    def list_namespaced_pod(self, namespace, label_selector):
        self.calls.append(("list", namespace, label_selector))
        return SimpleNamespace(items=self.pods)

    def delete_namespaced_pod(self, name, namespace, **kwargs):
        self.calls.append(("delete", name, kwargs))
        raise ApiException(status=404, reason="Not Found")

    def read_namespaced_pod(self, name, namespace):
        raise ApiException(status=403, reason="Forbidden")

    def read_namespaced_pod_log(self, name, namespace, container, tail_lines):
        self.calls.append(("log", name, container, tail_lines))
        return "l1\nl2"

    def list_node(self, **kwargs):
        self.calls.append(("list_node", kwargs))
        if kwargs.get("label_selector") == "forbidden=yes":
            raise ApiException(status=403, reason="Forbidden")
        return SimpleNamespace(items=[k8s.V1Node.from_dict(NODE)])


NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-a", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
    "spec": {"unschedulable": True},
    "status": {
        "allocatable": {"cpu": "7500m", "memory": "32920184Ki", "nvidia.com/gpu": "4"},
        "conditions": [{"type": "Ready", "status": "True", "lastHeartbeatTime": "2025-05-01T12:00:00Z"}],
    },
}


@pytest.fixture
def core():
    return StubCore()


async def test_create_sends_a_typed_pod_and_returns_a_plain_dict(core):
    api = ClientKubeApi(core)
    created = await api.create_pod("jobs", POD)
    sent = core.calls[0][2]
    assert isinstance(sent, k8s.V1Pod) and sent.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert created == POD


async def test_errors_are_translated(core):
    api = ClientKubeApi(core)
    with pytest.raises(KubeAlreadyExists):
        await api.create_pod("jobs", {**POD, "metadata": {"name": "taken"}})
    with pytest.raises(KubeApiError) as error:
        await api.read_pod("jobs", "p0")
    assert error.value.status == 403 and not isinstance(error.value, KubeNotFound)


async def test_list_returns_camel_case_dicts_with_iso_times(core):
    (pod,) = await ClientKubeApi(core).list_pods("jobs", "a=b")
    assert pod["status"] == {"phase": "Running", "startTime": "2025-05-01T12:00:00+00:00"}
    assert core.calls == [("list", "jobs", "a=b")]


async def test_delete_by_selector_tolerates_pods_already_gone(core):
    assert await ClientKubeApi(core).delete_pods("jobs", "a=b", 5) == 0
    assert core.calls[-1] == ("delete", "p0", {"grace_period_seconds": 5, "propagation_policy": "Background"})


async def test_read_log(core):
    assert await ClientKubeApi(core).read_pod_log("jobs", "p0", "worker", 10) == "l1\nl2"
    assert core.calls[-1] == ("log", "p0", "worker", 10)


async def test_list_nodes_returns_camel_case_dicts_with_a_timeout_and_the_selector_when_given(core):
    api = ClientKubeApi(core)
    (node,) = await api.list_nodes()
    assert node["spec"] == {"unschedulable": True}
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    assert node["status"]["conditions"][0]["lastHeartbeatTime"] == "2025-05-01T12:00:00+00:00"
    await api.list_nodes("nvidia.com/gpu.present=true")
    assert [c[1] for c in core.calls] == [
        {"_request_timeout": 10},
        {"_request_timeout": 10, "label_selector": "nvidia.com/gpu.present=true"},
    ]
    with pytest.raises(KubeApiError) as error:
        await api.list_nodes("forbidden=yes")
    assert error.value.status == 403
