"""The gateway's way into the Kubernetes backend's replicas: a command through the pod exec API
(`kubernetes/podexec.py`), in the replica's pod's container (its working directory, environment, user and GPUs
are the container's own), and a port through the port-forward API (`kubeports.py`). An exec ends when its pod
does (the kubelet closes it)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from gpuyard.services.executor.gateway.kubeports import Tunnels
from gpuyard.services.executor.gateway.process import ExecProcess, Send
from gpuyard.services.executor.gateway.replicas import NoReplica, ReplicaKey
from gpuyard.services.executor.kubernetes import labels as job_labels
from gpuyard.services.executor.kubernetes.api import KubeApi, KubeApiError
from gpuyard.services.executor.kubernetes.manifests import CONTAINER
from gpuyard.services.executor.kubernetes.podexec import PodStream
from gpuyard.shared.contracts.api.access import ExecStart

READ_SECONDS = 0.2
SHELL = ["sh", "-c", "if command -v bash >/dev/null 2>&1; then exec bash; else exec sh; fi"]


def pod_argv(start: ExecStart, *, tty: bool) -> list[str]:
    """What the pod runs: the command, or a shell (bash where the image has it); with a terminal, its type."""
    argv = start.argv or SHELL
    return ["env", f"TERM={start.term}", *argv] if tty else argv


class KubeAccess:
    def __init__(self, backend: Any):
        """`backend`: the Kubernetes backend (its controller's API and namespace)."""
        self.api: KubeApi = backend.controller.api
        self.namespace: str = backend.controller.namespace
        self.tunnels = Tunnels(self.api, self.namespace)

    async def pod_of(self, key: ReplicaKey) -> dict:
        selector = job_labels.selector_string(
            job_labels.replica_selector(key.job_id, key.attempt, key.replica)
        )
        try:
            pods = await self.api.list_pods(self.namespace, selector)
        except KubeApiError as exc:
            raise NoReplica(503, f"the Kubernetes API cannot list {key}'s pod: {exc}") from None
        if not pods:
            raise NoReplica(404, f"{key} has no pod")
        phase = pods[0].get("status", {}).get("phase", "Unknown")
        if phase != "Running":
            raise NoReplica(409, f"{key}'s pod is {phase}")
        return pods[0]

    async def open_exec(self, key: ReplicaKey, start: ExecStart, *, tty: bool) -> ExecProcess:
        pod = await self.pod_of(key)
        name = pod["metadata"]["name"]
        try:
            stream = await self.api.exec_stream(
                self.namespace, name, CONTAINER, pod_argv(start, tty=tty), tty=tty
            )
        except KubeApiError as exc:
            raise NoReplica(409, f"the pod exec API refused: {exc}") from None
        if tty:
            await asyncio.to_thread(stream.resize, *start.size)
        return PodProcess(stream, tty=tty)

    async def port_url(self, key: ReplicaKey, port: int) -> str:
        pod = await self.pod_of(key)
        return await self.tunnels.url(pod["metadata"]["name"], port)


class PodProcess(ExecProcess):
    """A command in a pod, its stream read and written from threads."""

    def __init__(self, stream: PodStream, *, tty: bool):
        self.stream = stream
        self.tty = tty
        self.closed = asyncio.Event()

    async def pump_output(self, send: Send) -> None:
        try:
            while True:
                frames = await asyncio.to_thread(self.stream.read, READ_SECONDS)
                for channel, data in frames:
                    await send(channel, data)
                if not frames and not self.stream.is_open():
                    return
        finally:
            self.closed.set()

    async def write(self, data: bytes) -> None:
        with contextlib.suppress(Exception):  # (closed: the command has ended)
            await asyncio.to_thread(self.stream.write_stdin, data)

    async def close_stdin(self) -> None:
        if self.tty:
            await self.write(b"\x04")  # (a terminal's end of input: Ctrl-D)
            return
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.stream.close_stdin)

    def resize(self, cols: int, rows: int) -> None:
        with contextlib.suppress(Exception):
            self.stream.resize(cols, rows)

    async def wait(self) -> int:
        await self.closed.wait()
        code = self.stream.returncode
        return 1 if code is None else code

    async def kill(self) -> None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.stream.close)
        self.closed.set()

    def replica_alive(self) -> bool:
        return True  # (the pod's end closes the stream: the session ends with it)
