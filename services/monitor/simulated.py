"""Virtual GPUs (`--simulate-gpus N`) whose figures follow the jobs placed on them.

- utilization: the CPU use of the holding replica's process tree over the interval, in % of one core, capped
  at 100 (`sleep 600` reads about 0, a busy loop about 100); with several holders (shares), their sum, capped;
- memory used: what the holders were given, each its slice (`memory_bytes`) or its fraction of the GPU;
- temperature, power and the SM clock: a straight line from idle to busy (`FIGURES`), so that rules on them
  can be tried too; ECC counts 0, no XID, never lost.

A replica's processes are found from its pid file (`gpuyard.shared.runtime.paths.ReplicaFiles.pid`, written by its reaper on
this node: the pid of its first process, whose session holds every process it starts); a replica without one
(not started yet, or run by the Kubernetes backend) reads 0 %.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from gpuyard.services.monitor.cputime import CpuUse
from gpuyard.services.monitor.jobs import HeldGpu
from gpuyard.shared.contracts.events.nodes import GpuInfo, GpuProcessUse, GpuReading
from gpuyard.shared.runtime.paths import replica_files


@dataclass(frozen=True)
class Line:
    idle: float
    busy: float

    def at(self, utilization: float) -> float:
        return self.idle + (self.busy - self.idle) * utilization / 100


FIGURES = {
    "temperature_c": Line(32.0, 78.0),
    "power_w": Line(55.0, 280.0),
    "sm_clock_mhz": Line(210.0, 1410.0),
}
POWER_LIMIT_W = 300.0
MEMORY_CLOCK_MHZ = 1215


class ReplicaPids:
    """(job, attempt, replica) -> the pid of the replica's first process on this node, from its pid file."""

    def __init__(self, data_dir: Path, node: str):
        self.data_dir = data_dir
        self.node = node
        self.known: dict[tuple[str, int, int], int] = {}

    def pid(self, job_id: str, attempt: int, replica: int) -> int | None:
        key = (job_id, attempt, replica)
        pid = self.known.get(key)
        if pid is not None:
            return pid
        try:
            doc = json.loads(Path(replica_files(self.data_dir, job_id, attempt, replica).pid).read_text())
            if doc.get("node") != self.node:
                return None
            pid = self.known[key] = int(doc["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # not started yet (or not here)
        return pid

    def keep(self, held: list[HeldGpu]) -> None:
        """Forget the replicas no longer held."""
        live = {(h.holder.job_id, h.attempt, h.holder.replica) for h in held}
        for key in set(self.known) - live:
            del self.known[key]


class SimulatedGpus:
    def __init__(self, gpus: list[GpuInfo], pids: ReplicaPids, cpu: CpuUse | None = None):
        self.gpus = gpus
        self.pids = pids
        self.cpu = cpu or CpuUse()

    def read(self, held: list[HeldGpu]) -> list[GpuReading]:
        self.pids.keep(held)
        by_gpu: dict[int, list[tuple[HeldGpu, int | None]]] = defaultdict(list)
        for h in held:
            by_gpu[h.gpu_index].append((h, self.pids.pid(h.holder.job_id, h.attempt, h.holder.replica)))
        sessions = {pid for holds in by_gpu.values() for _, pid in holds if pid is not None}
        use = self.cpu.percent(sessions)
        readings = []
        for gpu in self.gpus:
            holds = by_gpu.get(gpu.index, [])
            utilization = min(100.0, sum(min(100.0, use.get(pid, 0.0)) for _, pid in holds if pid))
            slices = [(pid, self.slice(h, gpu.memory_bytes)) for h, pid in holds]
            used = min(gpu.memory_bytes, sum(size for _, size in slices))
            readings.append(
                GpuReading(
                    index=gpu.index,
                    uuid=gpu.uuid,
                    model=gpu.model,
                    utilization_pct=round(utilization, 1),
                    memory_util_pct=round(utilization / 2, 1),
                    memory_used_bytes=used,
                    memory_total_bytes=gpu.memory_bytes,
                    temperature_c=round(FIGURES["temperature_c"].at(utilization), 1),
                    power_w=round(FIGURES["power_w"].at(utilization), 1),
                    power_limit_w=POWER_LIMIT_W,
                    sm_clock_mhz=int(FIGURES["sm_clock_mhz"].at(utilization)),
                    memory_clock_mhz=MEMORY_CLOCK_MHZ,
                    ecc_corrected=0,
                    ecc_uncorrected=0,
                    processes=[GpuProcessUse(pid=pid, used_bytes=size) for pid, size in slices if pid],
                    holders=[h.holder for h, _ in holds],
                )
            )
        return readings

    @staticmethod
    def slice(held: HeldGpu, total: int) -> int:
        """The memory a holder was given: its slice, else its fraction of the GPU."""
        return held.holder.memory_bytes or int(held.holder.fraction * total)
