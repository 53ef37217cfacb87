"""The tenant log budget in the running executor (GPUYARD_TENANT_LOG_BUDGET): the real LocalBackend, real
replicas, a real event store. The running replicas of one tenant hold at most its budget of node log together:
beyond it their output is cut after the `[gpuyard] output truncated` line, while another tenant's replica
running at the same time keeps all of its output. A replica adopted by a restarted executor counts against
its own tenant's budget (the pid file says whose), from the whole log it already has. The Kubernetes backend's
mirrors of its pods' logs keep to the budget too."""

from __future__ import annotations

import fcntl
import json
import struct
import termios

import pytest

from gpuyard.services.executor.exits import AttemptKey
from gpuyard.services.executor.kubernetes.backend import KubernetesBackend
from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.controller import KubernetesController
from gpuyard.services.executor.logfile import NOTE, LogBudget
from gpuyard.services.executor.pidfiles import pid_file, read_pid_files
from gpuyard.shared.contracts.events.jobs import GpuShare
from gpuyard.shared.runtime.paths import log_files, log_path
from tests.unit.services.executor.fake_kube_api import FakeKubeApi
from tests.unit.services.executor.harness import Harness

LINE = 100  # bytes of each line a replica prints (its number, padded with x, and a newline)
LINES = 30  # 3,000 bytes a replica: one alone fits the budget, two together do not
BUDGET = 4000
TRUNCATED = f"{NOTE}output truncated: the running jobs of tenant 'vision'"


@pytest.fixture
async def h(tmp_path):
    harness = await Harness(tmp_path).open()
    yield harness
    await harness.close()


def printing(lines: int, then: str = "") -> str:
    """A replica's command: `lines` lines of LINE bytes, then `then`."""
    return f"for i in $(seq 1 {lines}); do printf '%0{LINE - 1}d\\n' $i; done; {then}"


def output(h: Harness, job: str, replica: int = 0) -> bytes:
    return b"".join(f.read_bytes() for f in log_files(log_path(h.data_dir, job, 1, replica)))


def unread(pump) -> int | str:
    """Bytes waiting in a replica's output pipe, not read yet by its pump."""
    if pump is None or pump.fd < 0:
        return "closed"
    return struct.unpack("i", fcntl.ioctl(pump.fd, termios.FIONREAD, b"\0\0\0\0"))[0]


def job_lines(text: bytes) -> list[bytes]:
    """The lines the job printed (the platform's own left out)."""
    return [line for line in text.splitlines() if line and not line.startswith(NOTE.encode())]


def job_bytes(text: bytes) -> bytes:
    return b"".join(line + b"\n" for line in job_lines(text))


async def test_a_tenants_replicas_are_cut_at_its_budget_together_and_another_tenants_are_not(h, tmp_path):
    ex = await h.executor(tenant_log_budget=BUDGET)
    release = tmp_path / "release"
    # each replica prints its lines, says so, then waits: both logs are open, and held, at once
    wait = (
        f"touch {tmp_path}/printed-$GPUYARD_REPLICA; "
        f"for n in $(seq 1 600); do [ -e {release} ] && exit 0; sleep 0.05; done; exit 1"
    )
    gang = await h.submit(tenant="vision", command=printing(LINES, wait), replicas=2)
    await h.place(ex, gang)
    await h.wait_for(
        lambda: any(TRUNCATED.encode() in output(h, gang, r) for r in (0, 1)),
        what="the truncated line in one of the gang's logs",
    )
    sinks = [ex.backend.replicas[(gang, 1)][r].sink for r in (0, 1)]

    def taken() -> int:
        return sum(len(job_bytes(output(h, gang, r))) + sinks[r].over_budget for r in (0, 1))

    await h.wait_for(  # every byte they printed is written or dropped
        lambda: taken() == 2 * LINES * LINE,
        what=lambda: (
            f"the executor to take all of the gang's output: {taken()} bytes of {2 * LINES * LINE}, "
            f"{[s.over_budget for s in sinks]} dropped, {[s.lost for s in sinks]} lost, unread "
            f"{[unread(rep.pump) for rep in ex.backend.replicas[(gang, 1)].values()]}, printed "
            f"{sorted(p.name for p in tmp_path.glob('printed-*'))}, {[output(h, gang, r) for r in (0, 1)]}"
        ),
    )

    other = await h.submit(tenant="nlp", command=printing(LINES))  # while vision's replicas hold its budget
    await h.place(ex, other)
    await h.wait(other, "succeeded")
    assert output(h, other) == b"".join(b"%0*d\n" % (LINE - 1, n) for n in range(1, LINES + 1))

    release.touch()
    await h.wait(gang, "succeeded")
    texts = [output(h, gang, r) for r in (0, 1)]
    printed = sum(len(job_bytes(text)) for text in texts)
    assert printed <= BUDGET < 2 * LINES * LINE  # cut together, at the budget
    cut = [text.decode() for text in texts if TRUNCATED.encode() in text]
    assert cut, texts
    for text in cut:  # the line says why, and nothing the job printed comes after it
        notes = [n for n, line in enumerate(text.splitlines()) if line.startswith(TRUNCATED)]
        assert len(notes) == 1 and notes[0] == len(text.splitlines()) - 1
        assert "GPUYARD_TENANT_LOG_BUDGET" in text.splitlines()[-1]
    assert ex.backend.log_budget.held == {}  # every byte given back once the replicas ended


async def test_an_adopted_replica_counts_against_its_tenants_budget_from_its_whole_log(h, tmp_path):
    ex = await h.executor(tenant_log_budget=BUDGET)
    go = tmp_path / "go"
    job = await h.submit(
        tenant="vision",
        command=printing(LINES, f"while [ ! -e {go} ]; do sleep 0.05; done; {printing(LINES)}"),
    )
    await h.place(ex, job)
    await h.wait_for(lambda: len(output(h, job)) == LINES * LINE, what="the first lines in the log")
    assert json.loads(pid_file(h.data_dir, job, 1, 0).read_text())["tenant"] == "vision"
    [record] = read_pid_files(h.data_dir, job, 1, "node-a")
    assert record.tenant == "vision"
    crash(ex)

    again = await h.executor(tenant_log_budget=BUDGET)
    await again.reconcile()
    assert again.backend.log_budget.held == {"vision": LINES * LINE}  # what its log held already
    go.touch()
    await h.wait(job, "succeeded")
    text = output(h, job)
    assert len(job_lines(text)) * LINE <= BUDGET and TRUNCATED.encode() in text
    assert again.backend.log_budget.held == {}


def test_a_pid_file_written_before_the_tenant_was_recorded_still_loads(tmp_path):
    path = pid_file(tmp_path, "job", 1, 0)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"node": "node-a", "pid": 4242, "start": 1, "reaper": 1, "fd": 5}))
    [record] = read_pid_files(tmp_path, "job", 1, "node-a")
    assert record.pid == 4242 and record.tenant == ""


def crash(ex) -> None:
    """The executor dies without stopping anything (its reaper goes on): forget its replicas as a crash would."""
    for task in list(ex.backend.watchers):
        task.cancel()
    ex.backend.reaper.close()
    ex.attempts._held.clear()
    for reps in ex.backend.replicas.values():
        for rep in reps.values():  # its descriptors go with it: only the new executor reads the output
            rep.pump.close()
            rep.sink.close()
    ex.backend.replicas.clear()


async def test_the_kubernetes_backend_mirrors_pods_logs_within_their_tenants_budget(h):
    """One executor mirrors every pod's log into the data dir: the running replicas of a tenant hold at most
    its budget there too; an adopted attempt's tenant is read from its pods' labels."""
    api = FakeKubeApi(namespace="jobs")
    controller = KubernetesController(api, KubernetesConfig(namespace="jobs", log_tail_lines=500))
    budget = LogBudget(BUDGET)
    backend = KubernetesBackend(
        controller, data_dir=h.data_dir, poll_interval=3600, log_interval=0, log_budget=budget
    )
    ex = await h.executor(backend=backend, executor_backend="kubernetes")
    job = await h.submit(tenant="vision", command="python train.py", replicas=2, resources={"gpus": 1})
    await h.place(ex, job, nodes=["gpu-1", "gpu-2"], gpus=[[GpuShare(index=0)], [GpuShare(index=0)]])
    pods = {int(p["metadata"]["labels"]["gpuyard.io/replica"]): name for name, p in api.pods.items()}
    printed = "".join(f"{n:0{LINE - 1}d}\n" for n in range(1, LINES + 1))
    for r, name in pods.items():
        api.set_status(name, phase="Running", node=f"gpu-{r + 1}")
        api.logs[name] = printed
    await ex.backend.poll_once()
    texts = [output(h, job, r) for r in (0, 1)]
    assert sum(len(job_bytes(text)) for text in texts) <= BUDGET
    assert any(TRUNCATED.encode() in text for text in texts)

    again = KubernetesBackend(controller, data_dir=h.data_dir, log_budget=LogBudget(BUDGET))
    assert await again.adopt(AttemptKey(job, 1), {0: "gpu-1", 1: "gpu-2"})
    assert again.tenants[AttemptKey(job, 1)] == "vision"
