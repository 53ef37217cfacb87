"""A stand-in replica for the gateway's tests: a real process in a session of its own, with a pid file where
the local backend's reaper would write it, and a listening socket of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import websockets

from gpuyard.services.executor.processes import process_start_time
from gpuyard.shared.runtime.paths import replica_files

SITE = str(Path(websockets.__file__).parents[1])

LISTENER = """
import asyncio
import sys
from websockets.asyncio.server import serve

async def echo(ws):
    async for message in ws:
        await ws.send(message)

def http(conn, request):
    if request.headers.get("Upgrade", "").lower() != "websocket":
        seen = f"path={request.path} auth={request.headers.get('Authorization')} cookie={request.headers.get('Cookie')}"
        answer = conn.respond(200, seen)
        answer.headers["Set-Cookie"] = "gpuyard_session=forged; Path=/"
        return answer

async def main():
    async with serve(echo, "127.0.0.1", int(sys.argv[1]), process_request=http) as server:
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Future()

asyncio.run(main())
"""
"""What the stand-in replica runs: on a port of its own, HTTP answers saying what reached it (its path and
query, and the credentials it was sent: none should be), and a WebSocket echo."""


@dataclass
class FakeReplica:
    proc: subprocess.Popen
    port: int
    cwd: Path

    def end(self) -> None:
        self.proc.kill()
        self.proc.wait()


def start_replica(
    data_dir: Path, node: str, job_id: str, attempt: int = 1, replica: int = 0, port: int = 0
) -> FakeReplica:
    """The replica, its server on `port` (0: a free one)."""
    files = replica_files(data_dir, job_id, attempt, replica)
    Path(files.attempt).mkdir(parents=True, exist_ok=True)
    cwd = Path(files.attempt) / "work"
    cwd.mkdir(exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", LISTENER, str(port)],
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "3", "RANK": str(replica), "PYTHONPATH": SITE},
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    record = {"pid": proc.pid, "start": process_start_time(proc.pid), "node": node, "cgroup": None}
    Path(files.pid).write_text(json.dumps(record))
    return FakeReplica(proc, port, cwd)
