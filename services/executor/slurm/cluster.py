"""The Slurm cluster's nodes as the scheduler sees them: one `NodeHeartbeat` per Slurm node that can take
GPUYARD's batch jobs. Pure: `sinfo` and `squeue` output in, heartbeats and reasons out.

A node is open when Slurm would start a job on it now: its state idle, mixed, allocated or completing, and
responding (no `*`); a node DOWN, DRAINED or DRAINING, FAIL, MAINT, in the future or powered down is announced
empty (no GPU, no CPU: nothing more is placed on it from that heartbeat on, while the scheduler keeps the node
and what runs there), with Slurm's state and reason in its `slurm_closed` label. A node without `gpu` gres is
announced with its CPUs only. Its GPUs are its `gpu` gres (`gpu:4`, `gpu:a100:4`), less the GPUs
that jobs submitted to Slurm outside GPUYARD hold on it (a GPU of which they hold shards counts as held): the
node announces only what is free of them, and its `slurm_outside` label says which jobs hold what
(`gpuyard nodes --json` shows it). Which device a job gets is Slurm's choice, so the indices are GPUYARD's
own count (0..n-1) and the uuids placeholders (`SLURM-<node>-<index>`). cpus and memory: the node's (sinfo's
total CPUs and RealMemory).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuyard.services.executor.slurm.queue import SlurmJob, expand_hostlist, gres_count
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat

MIB = 2**20
FIELDS = ("NodeList", "NodeAddr", "Gres", "StateLong", "Partition", "CPUsState", "Memory", "Reason")
FORMAT = ",".join(f"{name}:0|" for name in FIELDS)
"""sinfo's `-O` argument (with `-N`: one line per node and partition)."""
PLACEABLE = frozenset({"idle", "mixed", "allocated", "completing", "planned"})
STATE_FLAGS = "*~#!%$@^-+"


@dataclass
class SlurmNode:
    name: str
    address: str
    gres: str
    state: str
    partitions: list[str]
    cpus: int
    memory_mib: int
    reason: str = ""

    @property
    def gpus(self) -> int:
        return gres_total(self.gres, "gpu")

    @property
    def shards_per_gpu(self) -> int:
        """The node's `shard` gres per GPU (0: it shares no GPU through shards)."""
        gpus = self.gpus
        return gres_total(self.gres, "shard") // gpus if gpus else 0

    @property
    def gpu_type(self) -> str:
        found = re.search(r"(?:^|,)gpu:([^:,(]+):\d+", self.gres)
        return found[1] if found else ""


@dataclass(frozen=True)
class ClusterInventory:
    heartbeats: list[NodeHeartbeat] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    """Slurm node → why nothing is placed on it (it is announced empty)."""
    nodes: dict[str, SlurmNode] = field(default_factory=dict)
    """Every node listed, announced or not."""


def gres_total(gres: str, name: str) -> int:
    """How many of gres `name` a node has: "gpu:4,shard:16" → 4 (gpu), "gpu:a100:2(S:0-1)" → 2."""
    total = 0
    for item in re.split(r",(?![^(]*\))", gres):
        found = re.match(rf"^{re.escape(name)}(?::[^:(]+)?:(\d+)", item.strip())
        if found:
            total += int(found[1])
    return total


def parse_nodes(text: str) -> dict[str, SlurmNode]:
    """The nodes of `sinfo -N -h -O FORMAT`'s output; a node in several partitions is one node."""
    nodes: dict[str, SlurmNode] = {}
    for line in text.splitlines():
        parts = [part.strip() for part in line.split("|")]
        if len(parts) < len(FIELDS) or not parts[0]:
            continue
        name, address, gres, state, partition, cpus, memory, reason = parts[: len(FIELDS)]
        node = nodes.get(name)
        if node is None:
            total = cpus.split("/")[-1]
            node = nodes[name] = SlurmNode(
                name=name,
                address=address or name,
                gres="" if gres == "(null)" else gres,
                state=state.lower(),
                partitions=[],
                cpus=int(total) if total.isdigit() else 0,
                memory_mib=int(memory) if memory.isdigit() else 0,
                reason="" if reason in ("none", "(null)") else reason,
            )
        node.partitions.append(partition.rstrip("*"))
    return nodes


def not_placeable(node: SlurmNode) -> str | None:
    """Why GPUYARD must not place on the node now (None: it may)."""
    base = node.state.rstrip(STATE_FLAGS)
    because = f" ({node.reason})" if node.reason else ""
    if node.state.endswith("*"):
        return f"Slurm state {node.state}: not responding{because}"
    if base not in PLACEABLE:
        return f"Slurm state {node.state}{because}"
    return None


def held_outside(jobs: Iterable[SlurmJob], shards_per_gpu: Mapping[str, int]) -> dict[str, dict[str, int]]:
    """Node → {Slurm job id: GPUs it holds there}, for the running jobs submitted outside GPUYARD that hold GPUs
    (shards count as the GPUs they sit on, rounded up)."""
    held: dict[str, dict[str, int]] = {}
    for job in jobs:
        if job.replica_key is not None or not job.running or not job.tres_per_node:
            continue
        for node in expand_hostlist(job.nodes):
            shards = gres_count(job.tres_per_node, "shard")
            per = shards_per_gpu.get(node) or 1
            gpus = gres_count(job.tres_per_node, "gpu") + (math.ceil(shards / per) if shards else 0)
            if gpus:
                held.setdefault(node, {})[job.slurm_id] = gpus
    return held


def cluster_inventory(
    nodes: Mapping[str, SlurmNode],
    jobs: Iterable[SlurmJob],
    *,
    interval_seconds: float,
    gpu_model: str,
    gpu_memory: int,
    labels: Mapping[str, str] | None = None,
) -> ClusterInventory:
    """One heartbeat per node: with the GPUs outside jobs leave free, or empty when it is closed."""
    inventory = ClusterInventory(nodes=dict(nodes))
    outside = held_outside(jobs, {name: node.shards_per_gpu for name, node in nodes.items()})
    for name, node in nodes.items():
        extra = {
            "backend": "slurm",
            "slurm_node": name,
            "slurm_state": node.state,
            "slurm_partitions": ",".join(node.partitions),
        }
        why = not_placeable(node)
        if why is not None:  # (announced empty: nothing more is placed on it from this heartbeat on)
            inventory.skipped[name] = why
            inventory.heartbeats.append(
                NodeHeartbeat(
                    node=name,
                    gpus=[],
                    cpus=0.0,
                    memory_bytes=0,
                    labels={**extra, "slurm_closed": why, **(labels or {})},
                    notes=[f"Slurm places nothing here: {why}"],
                    interval_seconds=interval_seconds,
                )
            )
            continue
        held = outside.get(name, {})
        free = max(0, node.gpus - sum(held.values()))
        if held:
            jobs_said = ", ".join(f"{job} ({n})" for job, n in sorted(held.items()))
            extra["slurm_outside"] = (
                f"{sum(held.values())} GPU(s) held by Slurm jobs outside GPUYARD: {jobs_said}"
            )
        if node.shards_per_gpu:
            extra["slurm_shards_per_gpu"] = str(node.shards_per_gpu)
        model = node.gpu_type.upper() if node.gpu_type else gpu_model
        inventory.heartbeats.append(
            NodeHeartbeat(
                node=name,
                gpus=[
                    GpuInfo(index=i, uuid=f"SLURM-{name}-{i}", model=model, memory_bytes=gpu_memory)
                    for i in range(free)
                ],
                cpus=float(node.cpus),
                memory_bytes=node.memory_mib * MIB,
                labels={**extra, **(labels or {})},
                notes=[extra["slurm_outside"]] if held else [],
                interval_seconds=interval_seconds,
            )
        )
    return inventory
