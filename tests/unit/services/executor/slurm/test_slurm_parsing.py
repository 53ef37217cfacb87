"""The Slurm backend's pure parts: reading squeue and sinfo, what a node announces, what a batch job's end means,
and the batch job a replica becomes."""

from __future__ import annotations

import signal

from gpuyard.services.executor.slurm import batch, cluster, outcomes, queue
from gpuyard.shared.contracts.events.jobs import FailureReason, GpuShare, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.settings.slurm import SlurmConfig


def queue_line(*fields: str) -> str:
    return "".join(f"{f:<30}|" for f in fields)


def job(
    state: str,
    status: int = 0,
    name: str = "gy-j1-a2-r0",
    tres: str = "",
    nodes: str = "n1",
    slurm_id: str = "7",
) -> queue.SlurmJob:
    return queue.SlurmJob(slurm_id, name, state, status, "None", nodes, tres)


def test_squeue_lines_are_read_and_gpuyard_jobs_known_by_name():
    text = "\n".join(
        [
            queue_line(
                "12",
                "gy-abc-def-a3-r1",
                "RUNNING",
                "0",
                "None",
                "n1",
                "gres:gpu:2",
                "root",
                "gpuyard tenant=t",
            ),
            queue_line(
                "13", "train", "FAILED", "768", "NonZeroExitCode", "n[1-2]", "(null)", "alice", "(null)"
            ),
            "garbage",
        ]
    )
    ours, theirs = queue.parse_queue(text)
    assert ours.replica_key == ("abc-def", 3, 1) and ours.running and ours.comment == "gpuyard tenant=t"
    assert theirs.replica_key is None and theirs.status == 768 and theirs.tres_per_node == ""
    assert queue.job_name("abc-def", 3, 1) == "gy-abc-def-a3-r1"


def test_gres_counts_and_host_lists():
    assert queue.gres_count("gres:gpu:2", "gpu") == 2
    assert queue.gres_count("gres/gpu=3", "gpu") == 3
    assert queue.gres_count("gres:gpu:a100:1,gres:shard:4", "shard") == 4
    assert queue.gres_count("gres:gpu", "gpu") == 1
    assert queue.expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert cluster.gres_total("gpu:a100:2(S:0-1),shard:8", "gpu") == 2
    assert cluster.gres_total("gpu:4,shard:16", "shard") == 16


def sinfo(
    name: str, state: str, gres: str = "gpu:4,shard:16", partition: str = "gpu*", reason: str = "none"
) -> str:
    return queue_line(name, "10.0.0.1", gres, state, partition, "0/32/0/32", "16000", reason)


def test_nodes_announce_free_gpus_and_closed_nodes_announce_nothing():
    nodes = cluster.parse_nodes(
        "\n".join(
            [
                sinfo("n1", "mixed"),
                sinfo("n1", "mixed", partition="long"),
                sinfo("n2", "down", reason="broken fan"),
                sinfo("n3", "idle*"),
                sinfo("n4", "drained"),
                sinfo("n5", "idle", gres="gpu:h100:8"),
            ]
        )
    )
    assert nodes["n1"].partitions == ["gpu", "long"] and nodes["n1"].shards_per_gpu == 4
    outside = [
        job("RUNNING", name="train", tres="gres:gpu:1", nodes="n1"),
        job("RUNNING", name="x", tres="gres:shard:1", nodes="n1", slurm_id="8"),
    ]
    ours = job("RUNNING", tres="gres:gpu:2", nodes="n5")
    inventory = cluster.cluster_inventory(
        nodes, [*outside, ours], interval_seconds=5, gpu_model="GPU", gpu_memory=2**34
    )
    beats = {hb.node: hb for hb in inventory.heartbeats}
    assert len(beats["n1"].gpus) == 2  # 4, less one held whole and one of which a shard is held
    assert "2 GPU(s) held by Slurm jobs outside GPUYARD" in beats["n1"].labels["slurm_outside"]
    assert beats["n1"].notes == [beats["n1"].labels["slurm_outside"]] and beats["n5"].notes == []
    assert (
        len(beats["n5"].gpus) == 8 and beats["n5"].gpus[0].model == "H100"
    )  # its own jobs are not subtracted
    for name in ("n2", "n3", "n4"):
        assert beats[name].gpus == [] and beats[name].cpus == 0 and name in inventory.skipped
    assert "broken fan" in beats["n2"].labels["slurm_closed"]
    assert beats["n2"].notes == [f"Slurm places nothing here: {beats['n2'].labels['slurm_closed']}"]
    assert "not responding" in inventory.skipped["n3"]


def test_batch_job_ends_map_to_the_same_causes_as_other_backends():
    assert outcomes.outcome(job("COMPLETED")) == (0, None, None, "")
    assert outcomes.outcome(job("FAILED", 3 << 8))[:3] == (3, None, FailureReason.EXIT_CODE)
    assert outcomes.outcome(job("FAILED", 127 << 8))[2] == FailureReason.COMMAND_NOT_FOUND
    assert outcomes.outcome(job("FAILED", 9))[:3] == (None, 9, FailureReason.SIGNAL)
    assert outcomes.outcome(job("CANCELLED"))[:3] == (None, int(signal.SIGTERM), FailureReason.SIGNAL)
    assert outcomes.outcome(job("TIMEOUT"))[2] == FailureReason.TIMEOUT
    assert outcomes.outcome(job("OUT_OF_MEMORY"))[2] == FailureReason.OOM_KILLED
    assert outcomes.outcome(job("NODE_FAIL"))[2] == FailureReason.NODE_LOST
    assert outcomes.outcome(job("PREEMPTED"))[2] == FailureReason.NODE_LOST
    assert outcomes.outcome(job("BOOT_FAIL"))[2] == FailureReason.START_FAILED
    assert not outcomes.finished(job("RUNNING")) and outcomes.finished(job("COMPLETED"))


def placement(*fractions: float) -> ReplicaPlacement:
    gpus = [GpuShare(index=i, fraction=f) for i, f in enumerate(fractions)]
    return ReplicaPlacement(replica=1, node="n1", gpus=gpus, cpus=1.5, memory_bytes=2**30)


def test_a_replica_becomes_a_pinned_batch_job_as_its_tenants_user():
    spec = JobSpec(
        name="t",
        command=["python", "train.py", "--lr", "1e-3"],
        timeout=600,
        resources={"cpus": 1.5, "memory": "1GiB"},
    )
    node = cluster.parse_nodes(sinfo("n1", "idle"))["n1"]
    config = SlurmConfig(partition="gpu", extra_args=["--exclusive"])
    files = batch.spool_files("/spool", "j1", 2, 1)
    user = JobUser(uid=4000123, gid=4000123, name="t")
    args = batch.sbatch_args(
        job_id="j1", attempt=2, tenant="t", spec=spec, placement=placement(1, 1), node=node, files=files,
        workdir="/w", user=user, user_has_account=False, grace=10, config=config,
    )  # fmt: skip
    for wanted in ("--job-name=gy-j1-a2-r1", "--nodelist=n1", "--gres=gpu:2", "--cpus-per-task=2", "--mem=1024M",
                   "--no-requeue", "--time=13", "--partition=gpu", "--export=ALL", "--exclusive"):  # fmt: skip
        assert wanted in args, (wanted, args)
    assert not any(a.startswith("--uid") for a in args)  # no account: setpriv in the script instead
    text = batch.script(
        env={"RANK": "1", "TOKEN": "a b'c"},
        spec=spec,
        files=files,
        user=user,
        user_has_account=False,
        title="x",
    )
    assert "export TOKEN='a b'\"'\"'c'" in text
    assert "setpriv --reuid=4000123 --regid=4000123 --clear-groups -- python train.py --lr 1e-3" in text
    assert "/spool/j1/attempt-2/replica-1.exit" in text
    with_account = batch.sbatch_args(
        job_id="j1", attempt=2, tenant="t", spec=spec, placement=placement(), node=node, files=files,
        workdir="/w", user=user, user_has_account=True, grace=10, config=SlurmConfig(),
    )  # fmt: skip
    assert "--uid=4000123" in with_account and not any(a.startswith("--gres") for a in with_account)


def test_a_fractional_gpu_is_shards_where_the_node_has_them_else_a_whole_gpu():
    node = cluster.parse_nodes(sinfo("n1", "idle"))["n1"]
    plain = cluster.parse_nodes(sinfo("n1", "idle", gres="gpu:4"))["n1"]
    assert batch.gres(placement(0.5), node, SlurmConfig()) == "shard:2"
    assert batch.gres(placement(0.1), node, SlurmConfig()) == "shard:1"
    assert batch.gres(placement(0.5), plain, SlurmConfig()) == "gpu:1"
    assert batch.gres(placement(0.5), node, SlurmConfig(fractions="whole")) == "gpu:1"
