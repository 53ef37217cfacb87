"""Limits of local replicas: cgroup v2 CPU and memory (against a fake cgroup tree), out-of-memory kills,
the GPU memory slice watch (driven by a fake NVML reader), and the MPS / memory-share environment."""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest

from gpuyard.services.executor.cgroups import Cgroups
from gpuyard.services.executor.gpuwatch import GpuProcess, NvmlProcessReader, SliceWatch, WatchedReplica
from gpuyard.services.executor.jobenv import mps_running, replica_env
from gpuyard.shared.contracts.events.jobs import GpuShare, JobPlaced, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec

GiB = 2**30


def fake_cgroup_tree(root, parent="gy", procs=""):
    """The files of a cgroup v2 mount the executor reads and writes (the kernel's are not plain files)."""
    for folder in (root, root / parent):
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        (folder / "cgroup.subtree_control").write_text("")
        (folder / "cgroup.procs").write_text("")
    (root / parent / "cgroup.procs").write_text(procs)
    return root / parent


# ---------------------------------------------------------------------- cgroups


@pytest.mark.parametrize("start", ["helper", "fork"])
async def test_cpu_and_memory_limits_go_into_the_replicas_cgroup(h, tmp_path, start):
    parent = fake_cgroup_tree(tmp_path / "cgroup")
    ex = await h.executor(cgroup_root=tmp_path / "cgroup", cgroup_parent="gy", replica_start=start)
    assert ex.backend.limits == f"enforced through cgroup v2 under {parent}"
    assert (parent / "cgroup.subtree_control").read_text() == "+cpu +memory"
    job = await h.submit(command="sleep 60", resources={"cpus": 0.5, "memory": "256MiB"})
    await h.place(ex, job)
    await h.wait(job, "running")
    cgroup = parent / f"gpuyard-{job}-a1-r0"
    assert (cgroup / "cpu.max").read_text() == "50000 100000"
    assert (cgroup / "memory.max").read_text() == str(256 * 2**20)
    pid = ex.backend.sessions((job, 1))[0]
    procs = cgroup / "cgroup.procs"  # written by the wrapper once the process runs
    await h.wait_for(lambda: procs.exists() and procs.read_text().strip() == str(pid), 5, "the pid")
    assert ex.nodes.heartbeat().labels["limits"] == ex.backend.limits
    assert (await h.wait(job, "running")).current.notes == []

    # the kernel's OOM killer at work: memory.events counts it, the replica dies by SIGKILL
    (cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    os.killpg(pid, signal.SIGKILL)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "oom_killed"
    assert view.message == "replica 0: killed for exceeding its memory limit (256 MiB)"


@pytest.mark.parametrize("start", ["helper", "fork"])  # (the helper's C, or the reaper's forked child)
async def test_a_replica_that_cannot_enter_its_cgroup_fails_to_start_with_that_reason(h, tmp_path, start):
    parent = fake_cgroup_tree(tmp_path / "cgroup")
    ex = await h.executor(cgroup_root=tmp_path / "cgroup", cgroup_parent="gy", replica_start=start)
    job = await h.submit(command="true")
    (parent / f"gpuyard-{job}-a1-r0" / "cgroup.procs").mkdir(parents=True)  # writing it fails
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed" and "could not enter its cgroup" in view.message


def test_the_executors_own_processes_move_to_a_leaf_first(tmp_path):
    parent = fake_cgroup_tree(tmp_path, "svc", procs="4242\n")
    status = Cgroups(tmp_path, None, own="/svc").setup()
    assert status.enforced
    assert (parent / "executor" / "cgroup.procs").read_text() == "4242"


@pytest.mark.parametrize(
    ("prepare", "words"),
    [
        (lambda root: None, "is not a cgroup v2 hierarchy"),
        (lambda root: fake_cgroup_tree(root, "other"), "cgroup " + "{root}/gy does not exist"),
        (
            lambda root: (fake_cgroup_tree(root) / "cgroup.controllers").write_text("cpu pids"),
            "lacks the memory controller",
        ),
    ],
)
def test_limits_that_cannot_be_enforced_say_why(tmp_path, prepare, words):
    root = tmp_path / "cgroup"
    root.mkdir()
    prepare(root)
    status = Cgroups(root, "gy").setup()
    assert not status.enforced
    assert status.message.startswith("not enforced on this node: ")
    assert words.format(root=root) in status.message


def test_limits_can_be_turned_off(tmp_path):
    fake_cgroup_tree(tmp_path)
    status = Cgroups(tmp_path, "gy", enabled=False).setup()
    assert not status.enforced and "GPUYARD_CGROUP_LIMITS=false" in status.message


async def test_a_node_without_cgroup_v2_says_so_on_the_node_and_on_each_job(h):
    ex = await h.executor()
    assert ex.nodes.heartbeat().labels["limits"].startswith("not enforced on this node")
    job = await h.submit(command="true")
    await h.place(ex, job)
    view = await h.wait(job, "succeeded")
    [note] = view.attempts[0].notes
    assert note.startswith("cpu and memory limits not enforced on this node: ")


# ---------------------------------------------------------------------- GPU memory slices


class FakeNvml:
    """Reports `used` bytes on GPU 0 for the given pids."""

    def __init__(self) -> None:
        self.used: dict[int, int] = {}

    def __call__(self) -> list[GpuProcess]:
        return [GpuProcess(pid=pid, gpu_index=0, used_bytes=used) for pid, used in self.used.items()]


async def start_shared_job(h, ex, memory=4 * GiB):
    job = await h.submit(command="sleep 60", resources={"gpus": 0.25, "gpu_memory": memory})
    await h.place(ex, job, gpus=[[GpuShare(index=0, fraction=0.25, memory_bytes=memory)]])
    await h.wait(job, "running")
    return job, ex.backend.sessions((job, 1))[0]


async def test_a_job_over_its_gpu_slice_is_stopped_after_the_grace_under_policy_stop(h):
    nvml = FakeNvml()
    ex = await h.executor(gpu_reader=nvml, gpu_memory_policy="stop", gpu_memory_grace=0.3)
    job, pid = await start_shared_job(h, ex)
    nvml.used = {pid: 3 * GiB, os.getpid(): 40 * GiB}  # the test process is no job's: ignored
    await ex.gpu_guard.check()
    assert not h.bus.of_kind("gpu_memory_over_slice")
    nvml.used[pid] = 6 * GiB
    await ex.gpu_guard.check()
    [alert] = h.bus.of_kind("gpu_memory_over_slice")
    assert alert.job_id == job and alert.gpu_index == 0 and alert.node == "node-a"
    assert (
        "uses 6 GiB of GPU 0, over its slice of 4 GiB; it is stopped if it stays over for 0.3s"
        in alert.message
    )
    assert (await h.view(job)).state == "running"  # not yet: the grace runs
    await asyncio.sleep(0.35)
    await ex.gpu_guard.check()
    view = await h.wait(job, "failed")
    assert view.failure_reason == "gpu_memory_exceeded"
    assert "used 6 GiB of GPU 0's memory, over its slice of 4 GiB, for more than 0.3s" in view.message


async def test_under_policy_warn_a_job_over_its_slice_only_gets_an_alert_then_a_resolution(h):
    nvml = FakeNvml()
    ex = await h.executor(gpu_reader=nvml, gpu_memory_policy="warn", gpu_memory_grace=0)
    job, pid = await start_shared_job(h, ex, memory=2 * GiB)
    nvml.used = {pid: 3 * GiB}
    await ex.gpu_guard.check()
    await ex.gpu_guard.check()
    assert len(h.bus.of_kind("gpu_memory_over_slice")) == 1  # one alert while it stays over
    assert "node policy: warn only" in h.bus.of_kind("gpu_memory_over_slice")[0].message
    nvml.used = {pid: GiB}
    await ex.gpu_guard.check()
    resolved = [e.data for e in h.bus.published if e.type.endswith("alert.resolved")]
    assert [r.alert_id for r in resolved] == [f"gpu_memory/{job}/1/0/0"]
    assert (await h.view(job)).state == "running"
    await ex.stop_attempt((job, 1), "cancelled", 1)
    await h.wait(job, "cancelled")


def test_the_slice_watch_adds_up_a_replicas_processes_and_allows_slack():
    clock = [100.0]
    sessions = {10: 10, 11: 10, 20: 20}
    watch = SliceWatch("stop", grace=5, slack_bytes=GiB // 2, session=sessions.get, clock=lambda: clock[0])
    replicas = [WatchedReplica("j", 1, 0, 10, {0: 2 * GiB}), WatchedReplica("k", 1, 0, 20, {1: GiB})]
    usage = [GpuProcess(10, 0, GiB), GpuProcess(11, 0, GiB + GiB // 4), GpuProcess(20, 1, GiB)]
    verdicts = watch.check(usage, replicas)  # 2.25 GiB of 2 GiB is within the 0.5 GiB slack
    assert not verdicts.over and not verdicts.stop
    usage.append(GpuProcess(11, 0, GiB))
    verdicts = watch.check(usage, replicas)
    assert [(o.job_id, o.used_bytes) for o in verdicts.over] == [("j", int(3.25 * GiB))]
    clock[0] += 5
    assert [o.job_id for o in watch.check(usage, replicas).stop] == ["j"]
    assert not watch.check(usage, replicas).stop  # each attempt is stopped once
    assert [o.job_id for o in watch.check([], replicas).back] == ["j"]


def test_a_bad_policy_is_refused():
    with pytest.raises(ValueError, match="'warn' or 'stop'"):
        SliceWatch("kill", grace=1)


async def test_without_nvml_the_watch_is_off_and_says_so_once(h, caplog):
    with caplog.at_level(logging.INFO, logger="gpuyard.node"):
        ex = await h.executor()
    assert ex.gpu_guard.reader is None
    said = [r.getMessage() for r in caplog.records if "not watched" in r.getMessage()]
    assert said == [
        "GPU memory slices are not watched on this node: this node has no NVIDIA GPU (its GPUs are simulated)"
    ]


def test_a_nodes_facts_are_said_by_its_first_executor_process_only(caplog):
    from gpuyard.services.executor.nodelog import node_log, said_by

    try:
        with caplog.at_level(logging.INFO, logger="gpuyard.node"):
            said_by(0)
            node_log.info("fact")
            said_by(1)
            node_log.warning("the same fact, from worker 1")
    finally:
        node_log.setLevel(logging.NOTSET)
    assert [r.getMessage() for r in caplog.records] == ["fact"]


def test_the_nvml_reader_says_why_it_cannot_read():
    reader = NvmlProcessReader()
    if reader.available:  # a machine with an NVIDIA driver: it reads, even if nothing runs
        assert isinstance(reader(), list)
        reader.close()
    else:
        assert reader.error and reader() == []


# ---------------------------------------------------------------------- environment


def env_for(share: GpuShare, mps: bool, total=16 * GiB):
    spec = JobSpec.model_validate({"command": "true", "resources": {"gpus": share.fraction}})
    placement = ReplicaPlacement(replica=0, node="n", gpus=[share])
    return replica_env(
        job_id="j",
        job_name="x",
        tenant="t",
        spec=spec,
        placed=JobPlaced(job_id="j", attempt=1, placements=[placement]),
        replica=placement,
        master_addr="127.0.0.1",
        master_port=1234,
        simulated=False,
        gpu_memory={0: total},
        mps=mps,
    )


def test_a_fractional_gpu_gets_its_share_and_mps_limits_where_mps_runs():
    env = env_for(GpuShare(index=0, uuid="GPU-abc", fraction=0.25, memory_bytes=4 * GiB), mps=True)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-abc"
    assert env["GPUYARD_GPU_MEMORY_FRACTION"] == "0.25" and env["GPUYARD_GPU_MEMORY_BYTES"] == str(4 * GiB)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"


def test_without_mps_only_the_share_and_a_slice_without_size_is_the_fraction_of_the_gpu():
    env = env_for(GpuShare(index=0, uuid="GPU-abc", fraction=0.5), mps=False, total=80 * GiB)
    assert env["GPUYARD_GPU_MEMORY_BYTES"] == str(40 * GiB)
    assert not any(k.startswith("CUDA_MPS_ACTIVE") or k.startswith("CUDA_MPS_PINNED") for k in env)


def test_mps_is_detected_by_its_control_pipe(tmp_path):
    assert not mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
    (tmp_path / "control").touch()
    assert mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)})
