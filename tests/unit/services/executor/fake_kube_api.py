"""An in-memory KubeApi for the executor's tests (it is no part of the product).

What it does: stores pods, Services, PersistentVolumeClaims and (cluster-scoped) PersistentVolumes by name,
gives them a uid and a creationTimestamp (pods phase Pending), refuses a second object of the same name
(KubeAlreadyExists), selects by `key=value,…` label selectors,
serves logs the test set, lists the nodes the test added (`add_node`, or `nodes` directly; `nodes_error`
makes every listing fail until it is cleared), and records every call.
What it does not do: no scheduling, kubelet or phase changes (the test sets status with `set_status`),
no admission, defaulting or schema validation, no namespaces beyond a name check, no garbage collection
through owner references, no watch, no resourceVersion conflicts; no provisioning, binding or pvc-protection:
a claim is deleted at once, used or not. Nodes are whatever dicts the test gives:
no node controller (conditions and taints change only when the test changes them), and selectors are only
`key=value` equalities (no `key`, `!=`, `in (…)`).
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuyard.services.executor.kubernetes.api import KubeAlreadyExists, KubeApiError, KubeNotFound


def matches(labels: dict[str, str], selector: str) -> bool:
    wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
    return all(labels.get(key) == value for key, value in wanted.items())


class FakeKubeApi:
    def __init__(self, namespace: str = "default", clock: Callable[[], datetime] | None = None) -> None:
        self.namespace = namespace
        self.clock = clock or (lambda: datetime.now(UTC))
        self.pods: dict[str, dict[str, Any]] = {}
        self.services: dict[str, dict[str, Any]] = {}
        self.claims: dict[str, dict[str, Any]] = {}
        self.persistent_volumes: dict[str, dict[str, Any]] = {}
        self.logs: dict[str, str] = {}
        """Pod name → its job container's log (absent: the container is waiting to start)."""
        self.init_logs: dict[tuple[str, str], str] = {}
        """(pod name, init container name) → that init container's log."""
        self.calls: list[tuple[str, str]] = []
        self.fail_once: dict[str, KubeApiError] = {}
        """name → an error the next create of that name raises (then forgets)."""
        self.nodes: dict[str, dict[str, Any]] = {}
        self.nodes_error: Exception | None = None
        """Raised by every `list_nodes` while set (the API server unreachable, RBAC refusing)."""

    # -------------------------------------------------------------- KubeApi

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        pod = self._store(self.pods, "create_pod", namespace, body)
        pod["status"] = {"phase": "Pending"}
        return copy.deepcopy(pod)

    async def create_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(self._store(self.services, "create_service", namespace, body))

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        self._check(namespace)
        self.calls.append(("read_pod", name))
        if name not in self.pods:
            raise KubeNotFound(f'pods "{name}" not found')
        return copy.deepcopy(self.pods[name])

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self._check(namespace)
        self.calls.append(("list_pods", label_selector))
        return [
            copy.deepcopy(p) for p in self.pods.values() if matches(p["metadata"]["labels"], label_selector)
        ]

    async def delete_pods(self, namespace: str, label_selector: str, grace_seconds: int | None) -> int:
        self._check(namespace)
        self.calls.append(("delete_pods", label_selector))
        return self._delete(self.pods, label_selector)

    async def delete_services(self, namespace: str, label_selector: str) -> int:
        self._check(namespace)
        self.calls.append(("delete_services", label_selector))
        return self._delete(self.services, label_selector)

    async def read_pod_log(self, namespace: str, name: str, container: str, tail_lines: int | None) -> str:
        self._check(namespace)
        self.calls.append(("read_pod_log", name))
        if name not in self.pods:
            raise KubeNotFound(f'pods "{name}" not found')
        text = self.init_logs.get((name, container), self.logs.get(name))
        if text is None:
            raise KubeApiError(400, f'container "{container}" in pod "{name}" is waiting to start')
        lines = text.splitlines()
        return "\n".join(lines[-tail_lines:] if tail_lines else lines)

    async def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        self.calls.append(("list_nodes", label_selector or ""))
        if self.nodes_error is not None:
            raise self.nodes_error
        return [
            copy.deepcopy(n)
            for n in self.nodes.values()
            if matches(n["metadata"].get("labels") or {}, label_selector or "")
        ]

    async def create_claim(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(self._store(self.claims, "create_claim", namespace, body))

    async def list_claims(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        self._check(namespace)
        self.calls.append(("list_claims", label_selector))
        return [
            copy.deepcopy(c) for c in self.claims.values() if matches(c["metadata"]["labels"], label_selector)
        ]

    async def delete_claim(self, namespace: str, name: str) -> bool:
        self._check(namespace)
        self.calls.append(("delete_claim", name))
        return self.claims.pop(name, None) is not None

    async def create_persistent_volume(self, body: dict[str, Any]) -> dict[str, Any]:
        return copy.deepcopy(self._store(self.persistent_volumes, "create_persistent_volume", None, body))

    async def list_persistent_volumes(self, label_selector: str) -> list[dict[str, Any]]:
        self.calls.append(("list_persistent_volumes", label_selector))
        return [
            copy.deepcopy(v)
            for v in self.persistent_volumes.values()
            if matches(v["metadata"]["labels"], label_selector)
        ]

    async def delete_persistent_volume(self, name: str) -> bool:
        self.calls.append(("delete_persistent_volume", name))
        return self.persistent_volumes.pop(name, None) is not None

    # -------------------------------------------------------------- test controls

    def add_node(
        self,
        name: str,
        *,
        allocatable: dict[str, str],
        labels: dict[str, str] | None = None,
        ready: str = "True",
        unschedulable: bool = False,
        taints: list[dict[str, str]] | None = None,
    ) -> dict[str, Any]:
        """A node as `kubectl get node -o json` shows it (the fields the executor reads). `labels` add to
        `kubernetes.io/hostname: <name>`; `ready` is the Ready condition's status ("True", "False",
        "Unknown", or "" for no Ready condition at all)."""
        spec: dict[str, Any] = {}
        if unschedulable:
            spec["unschedulable"] = True
        if taints:
            spec["taints"] = copy.deepcopy(taints)
        conditions = [{"type": "MemoryPressure", "status": "False"}]
        if ready:
            conditions.append({"type": "Ready", "status": ready})
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": spec,
            "status": {
                "allocatable": dict(allocatable),
                "capacity": dict(allocatable),
                "conditions": conditions,
            },
        }
        self.nodes[name] = node
        return node

    def set_status(self, name: str, **status: Any) -> None:
        """Replace a pod's status, e.g. set_status(name, phase="Running"); `node` sets spec.nodeName."""
        node = status.pop("node", None)
        if node is not None:
            self.pods[name]["spec"]["nodeName"] = node
        self.pods[name]["status"] = copy.deepcopy(status)

    def remove_pod(self, name: str) -> None:
        """The pod disappears, as when someone else deletes it."""
        del self.pods[name]

    # -------------------------------------------------------------- internals

    def _check(self, namespace: str) -> None:
        if namespace != self.namespace:
            raise KubeApiError(403, f"this fake serves namespace {self.namespace!r}, not {namespace!r}")

    def _store(self, objects: dict, call: str, namespace: str | None, body: dict[str, Any]) -> dict[str, Any]:
        """`namespace` None: a cluster-scoped object."""
        if namespace is not None:
            self._check(namespace)
        name = body["metadata"]["name"]
        self.calls.append((call, name))
        if name in self.fail_once:
            raise self.fail_once.pop(name)
        if name in objects:
            raise KubeAlreadyExists(f'{body["kind"].lower()}s "{name}" already exists')
        stored = copy.deepcopy(body)
        stored["metadata"].update(uid=str(uuid.uuid4()), creationTimestamp=self.clock().isoformat())
        if namespace is not None:
            stored["metadata"]["namespace"] = namespace
        objects[name] = stored
        return stored

    @staticmethod
    def _delete(objects: dict, selector: str) -> int:
        doomed = [name for name, obj in objects.items() if matches(obj["metadata"]["labels"], selector)]
        for name in doomed:
            del objects[name]
        return len(doomed)
