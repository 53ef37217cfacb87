"""Several nodes, faults between them: one platform and three more executor nodes (node-1, node-2, node-3, one
GPU each, each its own job root), a 3-replica gang across them. Each node plays a machine: in a network
namespace of its own, which reaches the platform's NATS through a veth link only (`tests/integration/netns.py`),
where the test runs as root; on loopback otherwise.

- node-3 is lost (SIGKILL of its executor's process group; its replica, in a session of its own under its
  reaper, runs on, as on a machine cut off from the others): the gang is requeued as one (`node_lost`), its
  replicas on node-1 and node-2 stopped;
- it waits (3 GPUs wanted, 2 left) until node-4 joins (hot plug), and is placed on node-1, node-2 and node-4;
- node-3 comes back: what it still ran of the gang's first attempt is stopped, and it takes new work;
- node-1 is drained as Slurm drains a node (`gpuyard nodes cordon`: `drain` is Kubernetes', which preempts its
  jobs): the gang finishes there, and the jobs submitted meanwhile and after run elsewhere.

The platform's own node has no GPU: every placement is on the nodes the test runs."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from gpuyard.shared.contracts.api.nodes import NodeOut

from . import netns
from .conftest import Platform, wait_for
from .netns import Netns
from .processes import descendants

pytestmark = pytest.mark.integration

NODE_TIMEOUT = 3.0
HEARTBEAT = 0.5


@pytest.fixture
def namespaces():
    """Network namespaces for the nodes, made on demand (none where they cannot be made: loopback)."""
    made: dict[str, Netns] = {}
    why = netns.available()
    if why is not None:
        warnings.warn(f"the nodes run on loopback: {why}", stacklevel=1)

    def of(name: str) -> Netns | None:
        if why is None and name not in made:
            made[name] = Netns.make(len(made) + 1)
        return made.get(name)

    yield of
    for ns in made.values():
        ns.remove()


@pytest.fixture
def platform(tmp_path):
    env = {"GPUYARD_NODE_TIMEOUT": str(NODE_TIMEOUT), "GPUYARD_HEARTBEAT_INTERVAL": str(HEARTBEAT)}
    if netns.available() is None:
        env["GPUYARD_SUBMIT_HOST"] = "0.0.0.0"  # (its NATS too: the nodes reach it through their links)
    p = Platform(tmp_path / "data", tmp_path / "config", simulate_gpus=0, executors=1, env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()
    p.kill_leftovers()


class Node:
    """One more executor node: its own name, job root and log, in a process group of its own, in its own
    network namespace (`ns`) when there is one."""

    def __init__(self, platform: Platform, name: str, base: Path, ns: Netns | None):
        self.platform, self.name, self.ns = platform, name, ns
        self.job_root = base / f"jobs-{name}"
        self.log = base / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Node:
        env = {
            **self.platform.joining_env("executor"),
            "GPUYARD_NODE_NAME": self.name,
            "GPUYARD_SIMULATE_GPUS": "1",
            "GPUYARD_HEARTBEAT_INTERVAL": str(HEARTBEAT),
            "GPUYARD_JOB_ROOT": str(self.job_root),
        }
        argv = [sys.executable, "-m", "gpuyard.services.executor"]
        if self.ns is not None:  # NATS through its link, as another machine reaches it
            env["GPUYARD_NATS_URL"] = f"nats://{self.ns.host_ip}:{self.platform.nats_port}"
            env["GPUYARD_ADVERTISE_ADDRESS"] = self.ns.ip
            argv = self.ns.argv(argv)
        self.proc = subprocess.Popen(
            argv,
            env=env,
            stdout=self.log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def apart(self) -> bool:
        """Whether its executor runs in a network namespace of its own (not the test's)."""
        assert self.proc is not None
        return os.readlink(f"/proc/{self.proc.pid}/ns/net") != os.readlink("/proc/self/ns/net")

    def lose(self) -> None:
        """The node's executor is gone at once (SIGKILL of its process group): no goodbye, no heartbeat. Its
        replicas, in sessions of their own under their reapers, run on."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def kill_all(self) -> None:
        """Everything of the node: its executor's process group and every process under it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        under = descendants(self.proc.pid)
        os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in under:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # a deliberate stop: its jobs too
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill_all()


def node(platform: Platform, name: str) -> NodeOut | None:
    return next((n for n in platform.client().nodes() if n.node == name), None)


def ready(platform: Platform, *names: str) -> None:
    for name in names:
        wait_for(lambda name=name: (n := node(platform, name)) and n.state == "ready", 30, what=name)


def running_replicas(marks: Path, go: Path) -> dict[str, int]:
    """The gang's replicas running now, by `node/attempt/replica`: each wrote its shell's pid when it started,
    and runs while that pid is still its shell (whose command line names `go`)."""
    alive = {}
    for line in marks.read_text().split() if marks.exists() else []:
        where, _, pid = line.rpartition("=")
        with contextlib.suppress(OSError):
            if str(go).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                alive[where] = int(pid)
    return alive


def gang_spec(marks: Path, go: Path) -> dict:
    """Three replicas of one GPU each, which wait for `go`."""
    command = (
        f'echo "$GPUYARD_NODE/$GPUYARD_ATTEMPT/$GPUYARD_REPLICA=$$" >> {marks}; '
        f"while [ ! -e {go} ]; do sleep 0.05; done"
    )
    return {
        "name": "gang",
        "command": ["sh", "-c", command],
        "replicas": 3,
        "resources": {"gpus": 1, "cpus": 0.05, "memory": "16MB"},
    }


def nodes_of(replicas: dict[str, int]) -> list[str]:
    return sorted(where.split("/")[0] for where in replicas)


def test_several_nodes_lose_one_requeue_the_gang_hot_plug_a_node_and_drain_one(
    platform, namespaces, tmp_path
):
    client = platform.client()
    nodes = {n: Node(platform, n, tmp_path, namespaces(n)).start() for n in ("node-1", "node-2", "node-3")}
    marks, go = tmp_path / "marks", tmp_path / "go"
    try:
        ready(platform, *nodes)
        assert all(n.apart() == (n.ns is not None) for n in nodes.values())
        job_id = client.submit(gang_spec(marks, go)).job_id
        placed = platform.wait_state(job_id, {"running"}, timeout=60)
        assert sorted(p.node for p in placed.placements) == ["node-1", "node-2", "node-3"]
        first = wait_for(
            lambda: len(now := running_replicas(marks, go)) == 3 and now, 30, what="the gang's replicas"
        )
        (left_on_3,) = [where for where in first if where.startswith("node-3/1/")]

        nodes["node-3"].lose()
        requeued = platform.wait_state(job_id, {"queued"}, timeout=NODE_TIMEOUT + 30)
        assert requeued.attempt == 2
        assert (
            requeued.attempts[0].summary == "requeued: node_lost" and "node-3" in requeued.attempts[0].message
        )
        wait_for(
            lambda: sorted(running_replicas(marks, go)) == [left_on_3],
            30,
            what="the survivors' replicas of attempt 1 stopped, node-3's running on",
        )
        assert node(platform, "node-3").state == "lost"
        waiting = wait_for(lambda: (j := client.job(job_id)).pending and j, 20, what="a reason to wait")
        assert waiting.state == "queued"

        nodes["node-4"] = Node(platform, "node-4", tmp_path, namespaces("node-4")).start()  # hot plug
        again = platform.wait_state(job_id, {"running"}, timeout=60)
        assert again.attempt == 2
        assert sorted(p.node for p in again.placements) == ["node-1", "node-2", "node-4"]

        nodes["node-3"].start()  # back: what it still runs of attempt 1 is stopped
        ready(platform, "node-3")
        replicas = wait_for(
            lambda: len(now := running_replicas(marks, go)) == 3 and left_on_3 not in now and now,
            30,
            what="node-3's replica of attempt 1 stopped, attempt 2's three running",
        )
        said = "moved on while this node was away; stopped 1 replica(s)"
        wait_for(lambda: said in nodes["node-3"].log.read_text(), 10, what="node-3 saying what it stopped")
        assert nodes_of(replicas) == ["node-1", "node-2", "node-4"]
        assert {where.split("/")[1] for where in replicas} == {"2"}

        # drained as Slurm drains (`cordon` here: docs/operations.md; `drain` is Kubernetes', which preempts)
        client.node_control("node-1", "cordon")
        drained = client.submit({"command": "true", "resources": {"gpus": 1, "cpus": 0.05}}).job_id
        elsewhere = platform.wait_state(drained, {"succeeded"}, timeout=60)
        assert elsewhere.placements[0].node == "node-3"  # the one node with a free GPU, not draining
        go.touch()  # the gang finishes, on the drained node too
        assert platform.wait_state(job_id, {"succeeded"}, timeout=60).state == "succeeded"
        after = client.submit({"command": "true", "resources": {"gpus": 1, "cpus": 0.05}}).job_id
        assert platform.wait_state(after, {"succeeded"}, timeout=60).placements[0].node != "node-1"
    finally:
        go.touch()
        for n in nodes.values():
            n.stop()
