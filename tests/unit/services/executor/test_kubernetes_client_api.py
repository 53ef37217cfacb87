"""ClientKubeApi over a stand-in for the client's CoreV1Api (no API server): the requests it makes, the
dicts it returns and how it translates the client's ApiException."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from gpuyard.services.executor.kubernetes.api import KubeAlreadyExists, KubeApiError, KubeNotFound
from gpuyard.services.executor.kubernetes.client_api import ClientKubeApi

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
        """As the API server answers: the stored pod, a new object with a uid, a creation time (a datetime in
        the client's model) and phase Pending, not the body it was sent."""
        self.calls.append(("create_pod", namespace, body))
        if body.metadata.name == "taken":
            raise ApiException(status=409, reason="Conflict")
        stored = k8s.V1Pod.from_dict(body.to_dict())
        stored.metadata.uid = "0b7f7d7e-uid"
        stored.metadata.namespace = namespace
        stored.metadata.creation_timestamp = datetime(2025, 5, 1, 12, 0, tzinfo=UTC)
        stored.status = k8s.V1PodStatus(phase="Pending")
        return stored

    def list_namespaced_pod(self, namespace, label_selector):
        self.calls.append(("list", namespace, label_selector))
        return SimpleNamespace(items=self.pods)

    def delete_namespaced_pod(self, name, namespace, **kwargs):
        self.calls.append(("delete", name, kwargs))
        raise ApiException(status=404, reason="Not Found")

    def read_namespaced_pod(self, name, namespace):
        raise ApiException(status=403, reason="Forbidden")

    def read_namespaced_pod_log(self, name, namespace, container=None, tail_lines=None):
        """As the API server answers: the log of that pod's container, its last `tail_lines` lines."""
        self.calls.append(("log", name, container, tail_lines))
        if (namespace, name, container) not in LOGS:
            raise ApiException(status=404, reason="Not Found")
        lines = LOGS[(namespace, name, container)].splitlines(keepends=True)
        return "".join(lines[-tail_lines:] if tail_lines else lines)

    def list_node(self, **kwargs):
        self.calls.append(("list_node", kwargs))
        if kwargs.get("label_selector") == "forbidden=yes":
            raise ApiException(status=403, reason="Forbidden")
        return SimpleNamespace(items=[k8s.V1Node.from_dict(NODE)])

    def create_namespaced_persistent_volume_claim(self, namespace, body):
        self.calls.append(("create_claim", namespace, body))
        if body.metadata.name == "taken":
            raise ApiException(status=409, reason="Conflict")
        stored = k8s.V1PersistentVolumeClaim.from_dict(body.to_dict())
        stored.metadata.uid, stored.metadata.namespace = "claim-uid", namespace
        return stored

    def list_namespaced_persistent_volume_claim(self, namespace, label_selector):
        self.calls.append(("list_claims", namespace, label_selector))
        return SimpleNamespace(items=[k8s.V1PersistentVolumeClaim.from_dict(CLAIM)])

    def delete_namespaced_persistent_volume_claim(self, name, namespace):
        self.calls.append(("delete_claim", name, namespace))
        if name != "c0":
            raise ApiException(status=404, reason="Not Found")

    def create_persistent_volume(self, body):
        self.calls.append(("create_pv", body))
        if body.metadata.name == "taken":
            raise ApiException(status=409, reason="Conflict")
        return k8s.V1PersistentVolume.from_dict(body.to_dict())

    def list_persistent_volume(self, label_selector):
        self.calls.append(("list_pvs", label_selector))
        return SimpleNamespace(items=[k8s.V1PersistentVolume.from_dict(PV)])

    def delete_persistent_volume(self, name):
        self.calls.append(("delete_pv", name))
        if name != "pv0":
            raise ApiException(status=403, reason="Forbidden")


CLAIM = {
    "apiVersion": "v1",
    "kind": "PersistentVolumeClaim",
    "metadata": {"name": "c0", "labels": {"a": "b"}, "annotations": {"gpuyard.io/volume": "imagenet"}},
    "spec": {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": "5000000000"}},
        "storageClassName": "",
        "volumeName": "pv0",
    },
}
PV = {
    "apiVersion": "v1",
    "kind": "PersistentVolume",
    "metadata": {"name": "pv0", "labels": {"a": "b"}},
    "spec": {
        "capacity": {"storage": "5000000000"},
        "accessModes": ["ReadWriteMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "nfs": {"server": "nfs", "path": "/exports/volumes/team/imagenet"},
        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "jobs", "name": "c0"},
    },
}


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


LOGS = {("jobs", "p0", "worker"): "l1\nl2\nl3\n", ("jobs", "p0", "sidecar"): "s1\n"}


@pytest.fixture
def core():
    return StubCore()


async def test_create_sends_a_typed_pod_and_returns_the_servers_pod_as_a_plain_dict(core):
    api = ClientKubeApi(core)
    created = await api.create_pod("jobs", POD)
    (call,) = core.calls
    assert call[:2] == ("create_pod", "jobs")
    sent = call[2]
    assert isinstance(sent, k8s.V1Pod) and sent.spec.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
    assert sent.metadata.name == "p0" and sent.metadata.labels == {"a": "b"}
    # the server's answer, in the dict form the controller reads: camelCase keys, ISO times, no None fields
    assert created["metadata"] == {
        "name": "p0",
        "namespace": "jobs",
        "labels": {"a": "b"},
        "uid": "0b7f7d7e-uid",
        "creationTimestamp": "2025-05-01T12:00:00+00:00",
    }
    assert created["status"] == {"phase": "Pending"}
    assert created["spec"] == POD["spec"] and created["apiVersion"] == "v1"


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


async def test_read_log_asks_for_the_pods_container_and_its_tail(core):
    api = ClientKubeApi(core)
    assert await api.read_pod_log("jobs", "p0", "worker", 2) == "l2\nl3\n"
    assert await api.read_pod_log("jobs", "p0", "worker", None) == "l1\nl2\nl3\n"
    assert await api.read_pod_log("jobs", "p0", "sidecar", None) == "s1\n"
    assert core.calls == [
        ("log", "p0", "worker", 2),
        ("log", "p0", "worker", None),
        ("log", "p0", "sidecar", None),
    ]
    with pytest.raises(KubeNotFound):  # a pod (or namespace) without that log: what the controller catches
        await api.read_pod_log("other", "p0", "worker", 2)


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


async def test_claims_are_sent_typed_listed_as_dicts_and_deleted_by_name(core):
    api = ClientKubeApi(core)
    created = await api.create_claim("jobs", CLAIM)
    sent = core.calls[-1][2]
    assert isinstance(sent, k8s.V1PersistentVolumeClaim)
    assert sent.spec.volume_name == "pv0" and sent.spec.storage_class_name == ""  # "" kept: no class
    assert created["spec"] == CLAIM["spec"] and created["metadata"]["uid"] == "claim-uid"
    with pytest.raises(KubeAlreadyExists):
        await api.create_claim("jobs", {**CLAIM, "metadata": {"name": "taken"}})
    (listed,) = await api.list_claims("jobs", "a=b")
    assert listed["metadata"]["annotations"] == {"gpuyard.io/volume": "imagenet"}
    assert core.calls[-1] == ("list_claims", "jobs", "a=b")
    assert await api.delete_claim("jobs", "c0") is True
    assert await api.delete_claim("jobs", "gone") is False  # already gone: no error


async def test_persistent_volumes_are_cluster_scoped_calls(core):
    api = ClientKubeApi(core)
    created = await api.create_persistent_volume(PV)
    sent = core.calls[-1][1]
    assert isinstance(sent, k8s.V1PersistentVolume) and sent.spec.nfs.path == "/exports/volumes/team/imagenet"
    assert created["spec"] == PV["spec"]
    with pytest.raises(KubeAlreadyExists):
        await api.create_persistent_volume({**PV, "metadata": {"name": "taken"}})
    (listed,) = await api.list_persistent_volumes("a=b")
    assert listed["spec"]["claimRef"]["name"] == "c0"
    assert await api.delete_persistent_volume("pv0") is True
    with pytest.raises(KubeApiError) as error:  # a refusal is not "gone"
        await api.delete_persistent_volume("other")
    assert error.value.status == 403
