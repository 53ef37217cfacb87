"""The few Kubernetes API calls the controller makes, as a protocol: the real client or a test's fake.

Objects go in and come out as API-shaped dicts (camelCase keys, timestamps as ISO strings), the form
`kubectl get -o json` shows, so the controller never touches the client library's model classes.
"""

from __future__ import annotations

import socket
from typing import Any, Protocol

from gpuyard.services.executor.kubernetes.podexec import PodStream


class KubeApiError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(f"Kubernetes API error {status}: {message}")
        self.status = status
        self.message = message


class KubeAlreadyExists(KubeApiError):
    def __init__(self, message: str = "already exists"):
        super().__init__(409, message)


class KubeNotFound(KubeApiError):
    def __init__(self, message: str = "not found"):
        super().__init__(404, message)


class KubeApi(Protocol):
    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """The created pod (with its uid). Raises KubeAlreadyExists when the name is taken."""
        ...

    async def create_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """The created Service. Raises KubeAlreadyExists when the name is taken."""
        ...

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """Raises KubeNotFound."""
        ...

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    async def delete_pods(self, namespace: str, label_selector: str, grace_seconds: int | None) -> int:
        """Deletes the matching pods; how many it asked to delete. Missing ones are no error."""
        ...

    async def delete_services(self, namespace: str, label_selector: str) -> int: ...

    async def read_pod_log(self, namespace: str, name: str, container: str, tail_lines: int | None) -> str:
        """The whole log when tail_lines is None. Raises KubeNotFound for a missing pod, KubeApiError(400) for a container that never started."""
        ...

    async def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        """The cluster's nodes (cluster-scoped: needs a ClusterRole allowing `list` on `nodes`), only those
        matching `label_selector` when given."""
        ...

    async def create_claim(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """The created PersistentVolumeClaim. Raises KubeAlreadyExists when the name is taken."""
        ...

    async def list_claims(self, namespace: str, label_selector: str) -> list[dict[str, Any]]: ...

    async def delete_claim(self, namespace: str, name: str) -> bool:
        """False when it was not there. (A claim a pod still uses goes once that pod ends: pvc-protection.)"""
        ...

    async def create_persistent_volume(self, body: dict[str, Any]) -> dict[str, Any]:
        """Cluster-scoped: needs a ClusterRole allowing `create` on `persistentvolumes` (only with the NFS
        settings). Raises KubeAlreadyExists when the name is taken."""
        ...

    async def list_persistent_volumes(self, label_selector: str) -> list[dict[str, Any]]: ...

    async def delete_persistent_volume(self, name: str) -> bool:
        """False when it was not there."""
        ...

    async def exec_stream(
        self, namespace: str, pod: str, container: str, argv: list[str], *, tty: bool
    ) -> PodStream:
        """`argv` started in the pod's container through the exec API, its input open (with `tty`, a terminal:
        its output all on channel 1). Raises KubeApiError when the API server refuses it."""
        ...

    async def port_forward(self, namespace: str, pod: str, port: int) -> socket.socket:
        """A connection to the pod's `port` through the port-forward API, as a stream socket the caller owns
        (and closes). Raises KubeApiError when the API server refuses it."""
        ...
