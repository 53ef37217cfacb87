"""KubeApi over the official `kubernetes` client. The client is synchronous: each call runs in a thread."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException
from kubernetes.stream import portforward, stream

from gpuyard.services.executor.kubernetes.api import KubeAlreadyExists, KubeApiError, KubeNotFound
from gpuyard.services.executor.kubernetes.podexec import ClientPodStream, PodStream

T = TypeVar("T")
NODE_LIST_TIMEOUT_SECONDS = 10
"""A heartbeat round waits at most this long for the API server (the client has no timeout by default)."""


def translate(exc: ApiException) -> KubeApiError:
    message = exc.body if isinstance(exc.body, str) and exc.body else str(exc.reason or exc)
    if exc.status == 409:
        return KubeAlreadyExists(message)
    if exc.status == 404:
        return KubeNotFound(message)
    return KubeApiError(exc.status or 0, message)


class ClientKubeApi:
    def __init__(self, core: k8s.CoreV1Api) -> None:
        self.core = core
        self._serializer = k8s.ApiClient()

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> ClientKubeApi:
        """In-cluster credentials (the pod's service account) when present, else a kubeconfig file."""
        try:
            k8s_config.load_incluster_config()
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(config_file=kubeconfig)
        return cls(k8s.CoreV1Api())

    async def _call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return await asyncio.to_thread(method, *args, **kwargs)
        except ApiException as exc:
            raise translate(exc) from exc

    def _plain(self, obj: Any) -> Any:
        return self._serializer.sanitize_for_serialization(obj)

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        pod = await self._call(self.core.create_namespaced_pod, namespace, k8s.V1Pod.from_dict(body))
        return self._plain(pod)

    async def create_service(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        service = k8s.V1Service.from_dict(body)
        return self._plain(await self._call(self.core.create_namespaced_service, namespace, service))

    async def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self._plain(await self._call(self.core.read_namespaced_pod, name, namespace))

    async def list_pods(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        pods = await self._call(self.core.list_namespaced_pod, namespace, label_selector=label_selector)
        return [self._plain(pod) for pod in pods.items]

    async def delete_pods(self, namespace: str, label_selector: str, grace_seconds: int | None) -> int:
        deleted = 0
        for pod in await self.list_pods(namespace, label_selector):
            try:
                await self._call(
                    self.core.delete_namespaced_pod,
                    pod["metadata"]["name"],
                    namespace,
                    grace_period_seconds=grace_seconds,
                    propagation_policy="Background",
                )
                deleted += 1
            except KubeNotFound:
                pass
        return deleted

    async def delete_services(self, namespace: str, label_selector: str) -> int:
        services = await self._call(
            self.core.list_namespaced_service, namespace, label_selector=label_selector
        )
        deleted = 0
        for service in services.items:
            assert service.metadata is not None  # (the API server lists every object with its metadata)
            try:
                await self._call(self.core.delete_namespaced_service, service.metadata.name, namespace)
                deleted += 1
            except KubeNotFound:
                pass
        return deleted

    async def read_pod_log(self, namespace: str, name: str, container: str, tail_lines: int | None) -> str:
        return await self._call(
            self.core.read_namespaced_pod_log, name, namespace, container=container, tail_lines=tail_lines
        )

    async def list_nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        kwargs: dict[str, Any] = {"_request_timeout": NODE_LIST_TIMEOUT_SECONDS}
        if label_selector:
            kwargs["label_selector"] = label_selector
        nodes = await self._call(self.core.list_node, **kwargs)
        return [self._plain(node) for node in nodes.items]

    async def create_claim(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        claim = k8s.V1PersistentVolumeClaim.from_dict(body)
        return self._plain(
            await self._call(self.core.create_namespaced_persistent_volume_claim, namespace, claim)
        )

    async def list_claims(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        claims = await self._call(
            self.core.list_namespaced_persistent_volume_claim, namespace, label_selector=label_selector
        )
        return [self._plain(claim) for claim in claims.items]

    async def delete_claim(self, namespace: str, name: str) -> bool:
        try:
            await self._call(self.core.delete_namespaced_persistent_volume_claim, name, namespace)
        except KubeNotFound:
            return False
        return True

    async def create_persistent_volume(self, body: dict[str, Any]) -> dict[str, Any]:
        volume = k8s.V1PersistentVolume.from_dict(body)
        return self._plain(await self._call(self.core.create_persistent_volume, volume))

    async def list_persistent_volumes(self, label_selector: str) -> list[dict[str, Any]]:
        volumes = await self._call(self.core.list_persistent_volume, label_selector=label_selector)
        return [self._plain(volume) for volume in volumes.items]

    async def delete_persistent_volume(self, name: str) -> bool:
        try:
            await self._call(self.core.delete_persistent_volume, name)
        except KubeNotFound:
            return False
        return True

    async def exec_stream(
        self, namespace: str, pod: str, container: str, argv: list[str], *, tty: bool
    ) -> PodStream:
        def start() -> PodStream:
            ws = stream(
                self.core.connect_get_namespaced_pod_exec,
                pod,
                namespace,
                container=container,
                command=argv,
                stdin=True,
                stdout=True,
                stderr=not tty,
                tty=tty,
                _preload_content=False,
                binary=True,
            )
            return ClientPodStream(ws)

        try:
            return await asyncio.to_thread(start)
        except ApiException as exc:
            raise translate(exc) from exc
        except Exception as exc:  # (the WebSocket's own: a handshake refused, a connection lost)
            raise KubeApiError(0, f"{type(exc).__name__}: {exc}") from exc

    async def port_forward(self, namespace: str, pod: str, port: int) -> socket.socket:
        def start() -> socket.socket:
            forward = portforward(
                self.core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port)
            )
            end = forward.socket(port)
            owned = socket.socket(
                fileno=os.dup(end.fileno())
            )  # (the caller's; the forward's thread ends with it)
            end.close()
            return owned

        try:
            return await asyncio.to_thread(start)
        except ApiException as exc:
            raise translate(exc) from exc
        except Exception as exc:  # (the WebSocket's own: a handshake refused, a connection lost)
            raise KubeApiError(0, f"{type(exc).__name__}: {exc}") from exc
