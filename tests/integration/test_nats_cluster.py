"""A clustered bus survives the loss of its stream leader under load: `gpuyard up --nats-cluster 3` runs three
nats-servers as one JetStream cluster, every stream replicated on all three (R3), every service given the three
URLs. 500 trivial jobs flow; the server that leads the events stream is SIGKILLed mid-flow (`gpuyard up`
starts it again). Every job ends succeeded, each ran exactly once (each appends its id to one file), and the
services' /readyz said what their bus went through (a reconnect, or JetStream not answering while the
stream elected a new leader)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gpuyard.shared.contracts.events.subjects import STREAMS
from gpuyard.supervisor.busconfig import pid_path
from gpuyard.supervisor.options import ROUTE_PORT_OFFSET

from .conftest import BIN, Platform, free_ports, wait_for

pytestmark = pytest.mark.integration

JOBS = 500
KILL_AFTER = 150
"""Jobs submitted before the stream leader is killed: the rest are submitted while the cluster re-elects."""
SERVERS = 3
EVENTS = STREAMS[0].name


class ClusterPlatform(Platform):
    """`gpuyard up --nats-cluster 3`: NATS server k on nats_port + k, its routes on nats_port + 2000 + k."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.nats_port = cluster_base_port()

    @property
    def nats_url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{self.nats_port + k}" for k in range(SERVERS))

    async def bus(self, role: str):
        from gpuyard.shared.bus.credentials import read_credentials
        from gpuyard.shared.bus.jetstream import Bus

        creds = read_credentials(self.credentials(role))
        return await Bus.connect(
            self.nats_url.split(","), name=f"test-{role}", source="/test", credentials=creds
        )

    def start(self) -> ClusterPlatform:
        argv = [str(BIN / "gpuyard"), "up", "--data-dir", str(self.data_dir), "--port", str(self.port)]
        argv += ["--nats-port", str(self.nats_port), "--nats-cluster", str(SERVERS)]
        argv += ["--serving-port", str(self.serving_port), "--monitor-port", str(self.monitor_port)]
        argv += ["--simulate-gpus", str(self.simulate_gpus), "--node-name", "node-a"]
        argv += ["--executors", str(self.executors)]
        self.proc = subprocess.Popen(
            argv, env=self.env, cwd=self.cwd, stdout=self.log.open("ab"), stderr=subprocess.STDOUT
        )
        try:
            wait_for(self.ready, 90, 0.2, "gpuyard up --nats-cluster 3")
        except BaseException:
            self.stop()
            raise
        return self


def cluster_base_port() -> int:
    """A client port whose two neighbours above, and the three route ports 2000 above, are free too."""
    for _ in range(50):
        base = free_ports(1)[0]
        wanted = [base + k for k in range(SERVERS)] + [base + ROUTE_PORT_OFFSET + k for k in range(SERVERS)]
        if all(_free(port) for port in wanted):
            return base
    raise AssertionError("no run of free ports for three NATS servers")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def leader_of(platform: Platform, stream: str) -> str:
    """The server that leads `stream` now (JetStream's stream info, `cluster.leader`): `gpuyard-2`."""

    async def ask() -> str:
        bus = await platform.bus("submit")
        try:
            info = await bus.js.stream_info(stream)
            assert info.cluster is not None and info.cluster.leader, info
            assert info.config.num_replicas == SERVERS, info.config
            return info.cluster.leader
        finally:
            await bus.close()

    return asyncio.run(ask())


def server_pid(platform: Platform, name: str) -> int:
    number = int(name.rpartition("-")[2])
    return int(pid_path(platform.data_dir, number).read_text().strip())


def health_ports(up_pid: int) -> dict[str, int]:
    """Each service process's /readyz port, by its pid (from the command lines `gpuyard up` gave them)."""
    ports = {}
    for entry in Path("/proc").iterdir():
        try:
            if (
                not entry.name.isdigit()
                or int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) != up_pid
            ):
                continue
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError, ValueError):
            continue
        if "--health-port" in argv:
            ports[entry.name] = int(argv[argv.index("--health-port") + 1])
    return ports


def bus_said(ports: dict[str, int]) -> list[dict]:
    """What every service's /readyz says of its bus."""
    said = []
    for port in ports.values():
        try:
            said.append(httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json().get("bus", {}))
        except httpx.HTTPError:
            continue
    return said


def test_nats_cluster_loses_its_stream_leader_under_load_and_loses_no_job(tmp_path):
    marks = tmp_path / "marks"
    marks.touch(mode=0o666)
    env = {"GPUYARD_JOB_ROOT": str(tmp_path / "jobs")}
    p = ClusterPlatform(tmp_path / "data", tmp_path / "config", simulate_gpus=16, executors=1, env=env)
    p.start()
    try:
        client = p.client()
        spec = {
            "command": ["sh", "-c", f'echo "$GPUYARD_JOB_ID" >> {marks}'],
            "resources": {"gpus": 0.125, "cpus": 0.01, "memory": "1MB"},
        }
        ports = health_ports(p.proc.pid)
        assert all(said.get("state") == "connected" for said in bus_said(ports))
        with ThreadPoolExecutor(4) as pool:
            first = list(pool.map(lambda _: client.submit(spec).job_id, range(KILL_AFTER)))
            leader = leader_of(p, EVENTS)
            killed = server_pid(p, leader)
            os.kill(killed, signal.SIGKILL)
            rest = list(pool.map(lambda _: client.submit(spec).job_id, range(JOBS - KILL_AFTER)))
        ids = first + rest
        wait_for(  # `gpuyard up` starts the lost server again, which catches up with the others
            lambda: server_pid(p, leader) != killed, 30, what=f"{leader} started again"
        )
        wait_for(lambda: len(marks.read_text().split()) >= JOBS, 300, 0.5, f"{JOBS} jobs to have run")
        ended = wait_for(
            lambda: (
                (done := [client.job(i) for i in ids]) and all(j.state == "succeeded" for j in done) and done
            ),
            120,
            1,
            "every job succeeded",
        )
        assert len(ended) == JOBS
        ran = marks.read_text().split()
        assert sorted(ran) == sorted(ids), "a job lost or run twice"
        said = bus_said(ports)
        troubles = [str(s.get("last_trouble", {}).get("trouble", "")) + str(s.get("state", "")) for s in said]
        told = ("reconnecting to NATS (lost nats://127.0.0.1:", "JetStream not answering publishes")
        assert any(t in trouble for t in told for trouble in troubles), said
        assert leader_of(p, EVENTS)  # a leader again, with three replicas
    finally:
        if p.proc.poll() is None:
            p.stop()
        p.kill_leftovers()
