"""A command run in a replica's pod through the pod exec API (the submit service's `exec` and `shell` on the
Kubernetes backend, through the executor gateway: docs/access.md): `PodStream` is the exec's stream as the
gateway reads it, `ClientPodStream` the official client's WebSocket (`kubernetes.stream`) behind it. The client is
synchronous: the gateway calls a stream from threads (`gateway/kubeaccess.py`)."""

from __future__ import annotations

import json
from typing import Any, Protocol

STDOUT_CHANNEL, STDERR_CHANNEL, ERROR_CHANNEL, RESIZE_CHANNEL = 1, 2, 3, 4


class PodStream(Protocol):
    def read(self, timeout: float) -> list[tuple[int, bytes]]:
        """What came on the output channels (1, 2) within `timeout` seconds, in order; [] when nothing did."""
        ...

    def write_stdin(self, data: bytes) -> None: ...

    def close_stdin(self) -> None:
        """The end of the command's input (where the API server speaks the v5 protocol; else nothing)."""
        ...

    def resize(self, cols: int, rows: int) -> None: ...

    def is_open(self) -> bool: ...

    @property
    def returncode(self) -> int | None:
        """The command's exit code once the stream has closed (None before)."""
        ...

    def close(self) -> None: ...


def exit_status(status: Any) -> int:
    """The exit code the error channel's Status says: 0 for Success, the ExitCode cause's number, else 1."""
    if not isinstance(status, dict) or status.get("status") == "Success":
        return 0
    for cause in (status.get("details") or {}).get("causes") or []:
        if cause.get("reason") == "ExitCode":
            try:
                return int(cause.get("message", 1))
            except ValueError:
                return 1
    return 1


class ClientPodStream:
    """The official client's exec WebSocket (`WSClient`, binary)."""

    def __init__(self, ws: Any):
        self.ws = ws
        self._status: bytes = b""

    def read(self, timeout: float) -> list[tuple[int, bytes]]:
        self.ws.update(timeout=timeout)
        frames = []
        for channel in (STDOUT_CHANNEL, STDERR_CHANNEL):
            data = self.ws.read_channel(channel)
            if data:
                frames.append((channel, data if isinstance(data, bytes) else data.encode()))
        status = self.ws.read_channel(ERROR_CHANNEL)
        if status:
            self._status += status if isinstance(status, bytes) else status.encode()
        return frames

    def write_stdin(self, data: bytes) -> None:
        self.ws.write_stdin(data)

    def close_stdin(self) -> None:
        self.ws.close_channel(0)

    def resize(self, cols: int, rows: int) -> None:
        self.ws.write_channel(RESIZE_CHANNEL, json.dumps({"Width": cols, "Height": rows}).encode())

    def is_open(self) -> bool:
        return bool(self.ws.is_open())

    @property
    def returncode(self) -> int | None:
        if self.ws.is_open():
            return None
        try:
            return exit_status(json.loads(self._status or b"{}"))
        except ValueError:
            return 1

    def close(self) -> None:
        self.ws.close()
