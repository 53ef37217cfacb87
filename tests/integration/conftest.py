"""Fixtures that start real things: a nats-server with JetStream, and the whole platform via `gpuyard up`."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from gpuyard.client import Client
from gpuyard.shared.bus.credentials import credentials_path, read_credentials
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.api.jobs import JobOut
from gpuyard.supervisor import ports
from tests.s3server import UNSET, S3Server, aws_env

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]


def free_ports(n: int) -> list[int]:
    """`n` different free ports, as `gpuyard up` picks its own (below the kernel's ephemeral range)."""
    return ports.free_ports("127.0.0.1", n)


def free_port() -> int:
    return free_ports(1)[0]


def wait_for(check, timeout: float = 30, interval: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture
def nats_url(tmp_path):
    """A fresh nats-server with JetStream on a free port, for one test."""
    binary = BIN / "nats-server" if (BIN / "nats-server").exists() else shutil.which("nats-server")
    port = free_port()
    proc = subprocess.Popen(
        [str(binary), "-js", "-sd", str(tmp_path / "nats"), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def listening():
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, 10, what="nats-server")
    yield f"nats://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(10)


class Platform:
    """`gpuyard up` in a subprocess, on free ports, with its own data and config directories."""

    def __init__(
        self,
        data_dir: Path,
        config_dir: Path,
        simulate_gpus: int = 2,
        env: dict[str, str] | None = None,
        executors: int = 2,
        cwd: Path = ROOT,
    ):
        """`env`: extra environment for `gpuyard up` and so for every service (e.g. scheduler settings).
        `executors`: executor processes sharing the node (given, so that every machine runs the same).
        `cwd`: where it starts; the checkout by default, as `make demo` starts it (a job's `working_dir: .`)."""
        self.cwd = cwd
        self.data_dir = data_dir
        self.config_dir = config_dir
        self.simulate_gpus = simulate_gpus
        self.executors = executors
        self.port, self.nats_port, self.serving_port, self.monitor_port = free_ports(4)
        self.env = {**os.environ, "GPUYARD_CONFIG_DIR": str(config_dir), "PYTHONUNBUFFERED": "1"}
        self.env.setdefault(
            "GPUYARD_JOB_USERS", "*=platform"
        )  # jobs write to the tests' folders (see test_tenants)
        self.env.pop("GPUYARD_SERVER", None)
        self.env.pop("GPUYARD_TOKEN", None)
        self.env.update(env or {})
        self.proc: subprocess.Popen | None = None
        self.log = data_dir.parent / f"up-{data_dir.name}.log"

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    def credentials(self, role: str) -> Path:
        """The bus user `gpuyard up` made for `role` (gpuyard.shared.bus.permissions.Role)."""
        return credentials_path(self.data_dir, role)

    def joining_env(self, role: str) -> dict[str, str]:
        """The environment of one more service process of `role` joining this platform."""
        return {
            **self.env,
            "GPUYARD_NATS_URL": self.nats_url,
            "GPUYARD_NATS_CREDENTIALS": str(self.credentials(role)),
            "GPUYARD_DATA_DIR": str(self.data_dir),
        }

    async def bus(self, role: str) -> Bus:
        """A connection to this platform's NATS as the bus user of `role`."""
        creds = read_credentials(self.credentials(role))
        return await Bus.connect([self.nats_url], name=f"test-{role}", source="/test", credentials=creds)

    def start(self) -> Platform:
        self.proc = subprocess.Popen(
            [
                str(BIN / "gpuyard"),
                "up",
                "--data-dir",
                str(self.data_dir),
                "--port",
                str(self.port),
                "--nats-port",
                str(self.nats_port),
                "--serving-port",
                str(self.serving_port),
                "--monitor-port",
                str(self.monitor_port),
                "--simulate-gpus",
                str(self.simulate_gpus),
                "--node-name",
                "node-a",
                "--executors",
                str(self.executors),
            ],
            env=self.env,
            cwd=self.cwd,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
        )
        try:
            wait_for(self.ready, 60, 0.2, "gpuyard up")
        except BaseException:
            self.stop()  # never leave a half-started platform behind
            raise
        return self

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(
                f"gpuyard up exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            )
        try:
            client = self.client()
            return (
                client.healthy()
                and any(n["gpus"] for n in client.request("GET", "/v1/nodes"))
                or (self.simulate_gpus == 0 and client.healthy())
            )
        except Exception:
            return False

    def client(self) -> Client:
        import json

        token = json.loads((self.config_dir / "config.json").read_text())["token"]  # as `gpuyard up` saved it
        return Client(self.server, token, timeout=30)

    def cli(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(BIN / "gpuyard"), *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(60)

    def kill_leftovers(self) -> list[int]:
        """SIGKILL every process whose command line names this platform's data dir (reapers, jobs started
        there): after a test that had to kill `gpuyard up` itself, whose jobs a SIGKILL leaves running by design
        (docs/executor.md, "Restarts"), so that they do not burden the tests after it. The pids killed."""
        mark, killed = str(self.data_dir).encode(), []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if mark in (entry / "cmdline").read_bytes():
                    os.kill(int(entry.name), signal.SIGKILL)
                    killed.append(int(entry.name))
            except (OSError, ValueError):
                continue  # (gone meanwhile, or not ours to read)
        return killed

    def wait_state(self, job_id: str, states: set[str], timeout: float = 30) -> JobOut:
        client = self.client()
        return wait_for(
            lambda: (job := client.job(job_id)).state in states and job,
            timeout,
            0.1,
            f"job {job_id} in {states}",
        )


@contextmanager
def platform_on_s3(
    base: Path, variable: str, prefix: str, **kwargs
) -> Iterator[tuple[Platform, S3Server, str]]:
    """`gpuyard up` with `variable` set to `s3://<a new bucket>/<prefix>` and the standard AWS variables pointing
    at moto's S3 server on loopback (tests/s3server.py), as a user points a store at MinIO: (the platform, the
    server, the bucket). `kwargs`: the Platform's."""
    with S3Server() as server:
        bucket = server.new_bucket()
        env = {**aws_env(server.endpoint, base), variable: f"s3://{bucket}/{prefix}"}
        platform = Platform(base / "data", base / "config", env=env, **kwargs)
        for name in UNSET:
            platform.env.pop(name, None)
        platform.start()
        try:
            yield platform, server, bucket
        finally:
            if platform.proc.poll() is None:
                platform.stop()


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("platform")
    p = Platform(base / "data", base / "config").start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def sse_events(
    server: str, token: str, params: dict, count: int, timeout: float = 20, connected=None
) -> list[dict]:
    """The first `count` events of the SSE stream. `connected` (a threading.Event) is set when the server's
    ': connected' comment arrives: it sends it once its subscriptions are made, so what is published from
    then on reaches the stream."""
    import json

    events: list[dict] = []
    with httpx.stream(
        "GET",
        f"{server}/v1/events/stream",
        params=params,
        headers={"Authorization": f"Bearer {token}"},
        timeout=timeout,
    ) as response:
        for line in response.iter_lines():
            if line == ": connected" and connected is not None:
                connected.set()
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if len(events) >= count:
                    break
    return events
