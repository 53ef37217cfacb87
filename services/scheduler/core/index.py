"""Free capacity of every node, indexed for fast placement.

Per node, numpy arrays hold what a vectorised filter needs (free CPUs, memory, idle GPUs, largest free share,
GPU state id); per GPU, plain lists hold the free milli-GPU and free memory (the placement code touches one node
at a time). `take`/`give` keep both in step. Built from a `ClusterState` once per cycle, or kept alive across
events by the trace simulator: the same code places jobs in both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from services.scheduler.core.demand import MILLI, Demand, share_to_milli, used_to_milli
from services.scheduler.core.gpustate import STATES, GpuStateTable
from services.scheduler.core.model import EPS, ClusterState, ReplicaAssignment

MIXED = -2  # model id of a node whose GPUs are not all the same model


class CapacityIndex:
    __slots__ = (
        "names",
        "position",
        "gpu_ids",
        "gpu_models",
        "free",
        "gpu_memory_free",
        "gpu_memory_total",
        "cpus",
        "memory",
        "cpu_free",
        "mem_free",
        "idle",
        "max_free",
        "max_memory_free",
        "state",
        "node_model",
        "schedulable",
        "states",
        "_model_masks",
        "memo",
    )

    def __init__(
        self,
        names: Sequence[str],
        gpu_models: Sequence[Sequence[str]],
        gpu_memory: Sequence[Sequence[float]],
        cpus: Sequence[float],
        memory: Sequence[float],
        *,
        gpu_ids: Sequence[Sequence[int]] | None = None,
        used: Sequence[Sequence[int]] | None = None,
        used_memory: Sequence[Sequence[float]] | None = None,
        used_cpus: Sequence[float] | None = None,
        used_mem: Sequence[float] | None = None,
        schedulable: Sequence[bool] | None = None,
        states: GpuStateTable = STATES,
    ) -> None:
        n = len(names)
        self.states = states
        self.names = list(names)
        self.position = {name: i for i, name in enumerate(self.names)}
        self.gpu_ids = (
            [list(ids) for ids in gpu_ids]
            if gpu_ids is not None
            else [list(range(len(m))) for m in gpu_models]
        )
        self.gpu_models = [[states.model_id(m) for m in models] for models in gpu_models]
        self.gpu_memory_total = [[float(x) for x in mems] for mems in gpu_memory]
        self.free = (
            [[MILLI - u for u in row] for row in used]
            if used is not None
            else [[MILLI] * len(m) for m in gpu_models]
        )
        if used_memory is not None:
            self.gpu_memory_free = [
                [t - u for t, u in zip(tot, row, strict=True)]
                for tot, row in zip(self.gpu_memory_total, used_memory, strict=True)
            ]
        else:
            self.gpu_memory_free = [list(row) for row in self.gpu_memory_total]
        self.cpus = np.asarray(cpus, dtype=np.float64)
        self.memory = np.asarray(memory, dtype=np.float64)
        self.cpu_free = self.cpus - (
            np.asarray(used_cpus, dtype=np.float64) if used_cpus is not None else 0.0
        )
        self.mem_free = self.memory - (
            np.asarray(used_mem, dtype=np.float64) if used_mem is not None else 0.0
        )
        self.schedulable = (
            np.asarray(schedulable, dtype=bool) if schedulable is not None else np.ones(n, dtype=bool)
        )
        self.node_model = np.array(
            [(m[0] if m and all(x == m[0] for x in m) else (MIXED if m else -1)) for m in self.gpu_models],
            dtype=np.int32,
        )
        self.idle = np.zeros(n, dtype=np.int32)
        self.max_free = np.zeros(n, dtype=np.int32)
        self.max_memory_free = np.zeros(n, dtype=np.float64)
        self.state = np.zeros(n, dtype=np.int64)
        self._model_masks: dict[tuple[str, ...], np.ndarray] = {}
        self.memo: dict = {}  # per-index facts policies derive once (capacity per GPU model, ...)
        for i in range(n):
            self.refresh(i)

    # ----------------------------------------------------------------------------------------------- building
    @classmethod
    def from_state(cls, state: ClusterState) -> CapacityIndex:
        nodes = list(state.nodes.values())
        return cls(
            [n.name for n in nodes],
            [[g.model for g in n.gpus] for n in nodes],
            [[g.memory for g in n.gpus] for n in nodes],
            [n.cpus for n in nodes],
            [n.memory for n in nodes],
            gpu_ids=[[g.index for g in n.gpus] for n in nodes],
            used=[[used_to_milli(g.allocated) for g in n.gpus] for n in nodes],
            used_memory=[[g.allocated_memory for g in n.gpus] for n in nodes],
            used_cpus=[n.allocated_cpus for n in nodes],
            used_mem=[n.allocated_memory for n in nodes],
            schedulable=[n.schedulable for n in nodes],
        )

    def copy(self) -> CapacityIndex:
        clone = object.__new__(CapacityIndex)
        for name in ("names", "position", "gpu_ids", "gpu_models", "gpu_memory_total", "cpus", "memory"):
            setattr(clone, name, getattr(self, name))  # never mutated
        clone.states = self.states
        clone.node_model = self.node_model
        clone.schedulable = self.schedulable
        clone._model_masks = self._model_masks
        clone.memo = self.memo
        clone.free = [list(row) for row in self.free]
        clone.gpu_memory_free = [list(row) for row in self.gpu_memory_free]
        for name in ("cpu_free", "mem_free", "idle", "max_free", "max_memory_free", "state"):
            setattr(clone, name, getattr(self, name).copy())
        return clone

    def __len__(self) -> int:
        return len(self.names)

    # ----------------------------------------------------------------------------------------------- queries
    def refresh(self, i: int) -> None:
        """Recompute node i's aggregates after its GPUs changed."""
        row = self.free[i]
        self.idle[i] = row.count(MILLI)
        self.max_free[i] = max(row) if row else 0
        mems = self.gpu_memory_free[i]
        self.max_memory_free[i] = max(mems) if mems else 0.0
        self.state[i] = self.states.intern(int(self.node_model[i]), tuple(sorted(row, reverse=True)))

    def model_mask(self, models: tuple[str, ...]) -> np.ndarray:
        mask = self._model_masks.get(models)
        if mask is None:
            wanted = {self.states.model_id(m) for m in models}
            mask = np.array([any(g in wanted for g in row) for row in self.gpu_models], dtype=bool)
            self._model_masks[models] = mask
        return mask

    def candidates(self, demand: Demand) -> np.ndarray:
        """Positions of the nodes where one replica fits now (in node order)."""
        mask = (self.cpu_free >= demand.cpus - EPS) & (self.mem_free >= demand.memory) & self.schedulable
        if demand.count:
            if demand.whole:
                mask &= self.idle >= demand.count
            else:
                mask &= self.max_free >= demand.milli
                if demand.gpu_memory:
                    mask &= self.max_memory_free >= demand.gpu_memory
            if demand.models:
                mask &= self.model_mask(demand.models)
        found = np.flatnonzero(mask)
        if demand.count and found.size and (demand.gpu_memory or demand.models):
            # per-GPU conditions (memory on the same GPU as the share, mixed-model nodes): check exactly
            exact = [i for i in found.tolist() if len(self.eligible(i, demand)) >= demand.count]
            found = np.asarray(exact, dtype=np.int64)
        return found

    def eligible(self, i: int, demand: Demand) -> list[int]:
        """GPU slots of node i that can hold one GPU of the demand."""
        free = self.free[i]
        models = self.gpu_models[i]
        wanted = {self.states.model_id(m) for m in demand.models} if demand.models else None
        out = []
        for s, value in enumerate(free):
            if wanted is not None and models[s] not in wanted:
                continue
            if demand.whole:
                if value == MILLI and self.gpu_memory_total[i][s] >= demand.gpu_memory:
                    out.append(s)
            elif value >= demand.milli and self.gpu_memory_free[i][s] >= demand.gpu_memory:
                out.append(s)
        return out

    # ----------------------------------------------------------------------------------------------- changes
    def take(self, i: int, slots: Iterable[int], demand: Demand) -> None:
        self.cpu_free[i] -= demand.cpus
        self.mem_free[i] -= demand.memory
        if demand.count:
            free = self.free[i]
            mem = self.gpu_memory_free[i]
            for s in slots:
                free[s] -= demand.milli
                if not demand.whole:
                    mem[s] -= demand.gpu_memory
            self.refresh(i)

    def give(self, i: int, slots: Iterable[int], demand: Demand) -> None:
        self.cpu_free[i] += demand.cpus
        self.mem_free[i] += demand.memory
        if demand.count:
            free = self.free[i]
            mem = self.gpu_memory_free[i]
            for s in slots:
                free[s] = min(MILLI, free[s] + demand.milli)
                if not demand.whole:
                    mem[s] = min(self.gpu_memory_total[i][s], mem[s] + demand.gpu_memory)
            self.refresh(i)

    def slot_of(self, i: int, gpu_index: int) -> int:
        ids = self.gpu_ids[i]
        if gpu_index < len(ids) and ids[gpu_index] == gpu_index:
            return gpu_index
        return ids.index(gpu_index)

    def release(self, replicas: Iterable[ReplicaAssignment]) -> list[int]:
        """Give back what a running job holds; returns the node positions touched (unknown nodes are skipped)."""
        touched = []
        for r in replicas:
            i = self.position.get(r.node)
            if i is None:
                continue
            self.cpu_free[i] += r.cpus
            self.mem_free[i] += r.memory
            free = self.free[i]
            mem = self.gpu_memory_free[i]
            for g in r.gpus:
                s = self.slot_of(i, g.index)
                free[s] = min(MILLI, free[s] + (MILLI if g.fraction >= 1 else share_to_milli(g.fraction)))
                if g.memory:
                    mem[s] = min(self.gpu_memory_total[i][s], mem[s] + g.memory)
            self.refresh(i)
            touched.append(i)
        return touched

    def fits_exactly(self, replicas: Iterable[ReplicaAssignment]) -> bool:
        """Would these exact assignments fit on this index (every GPU, CPU and memory amount)?"""
        need_cpu: dict[int, float] = {}
        need_mem: dict[int, float] = {}
        need_gpu: dict[tuple[int, int], int] = {}
        need_gmem: dict[tuple[int, int], float] = {}
        for r in replicas:
            i = self.position[r.node]
            need_cpu[i] = need_cpu.get(i, 0.0) + r.cpus
            need_mem[i] = need_mem.get(i, 0.0) + r.memory
            for g in r.gpus:
                key = (i, self.slot_of(i, g.index))
                need_gpu[key] = need_gpu.get(key, 0) + (
                    MILLI if g.fraction >= 1 else share_to_milli(g.fraction)
                )
                need_gmem[key] = need_gmem.get(key, 0.0) + (g.memory or 0)
        if any(self.cpu_free[i] + EPS < c for i, c in need_cpu.items()):
            return False
        if any(self.mem_free[i] < m for i, m in need_mem.items()):
            return False
        if any(self.free[i][s] < v for (i, s), v in need_gpu.items()):
            return False
        return all(self.gpu_memory_free[i][s] >= v for (i, s), v in need_gmem.items())

    # ----------------------------------------------------------------------------------------------- totals
    def total_gpus(self) -> float:
        return float(sum(len(row) for row, ok in zip(self.free, self.schedulable, strict=True) if ok))

    def free_milli(self) -> int:
        return sum(sum(row) for row in self.free)

    def occupy(self, replicas: Iterable[ReplicaAssignment]) -> None:
        """Take back exactly what `release` gave (the inverse of `release`)."""
        for r in replicas:
            i = self.position.get(r.node)
            if i is None:
                continue
            self.cpu_free[i] -= r.cpus
            self.mem_free[i] -= r.memory
            free = self.free[i]
            mem = self.gpu_memory_free[i]
            for g in r.gpus:
                s = self.slot_of(i, g.index)
                free[s] = max(0, free[s] - (MILLI if g.fraction >= 1 else share_to_milli(g.fraction)))
                if g.memory:
                    mem[s] -= g.memory
            self.refresh(i)

    def room_for(self, i: int, slots: Iterable[int], demand: Demand) -> bool:
        """Is there room for one replica on exactly these GPU slots of node i?"""
        if self.cpu_free[i] + EPS < demand.cpus or self.mem_free[i] < demand.memory:
            return False
        free = self.free[i]
        mem = self.gpu_memory_free[i]
        for s in slots:
            if demand.whole:
                if free[s] != MILLI:
                    return False
            elif free[s] < demand.milli or mem[s] < demand.gpu_memory:
                return False
        return True

    def fits_one(self, i: int, demand: Demand) -> bool:
        """Does one replica fit on node i now (the scalar twin of `candidates`)?"""
        if (
            not self.schedulable[i]
            or self.cpu_free[i] + EPS < demand.cpus
            or self.mem_free[i] < demand.memory
        ):
            return False
        if not demand.count:
            return True
        if demand.whole and self.idle[i] < demand.count:
            return False
        if not demand.whole and self.max_free[i] < demand.milli:
            return False
        if demand.gpu_memory or demand.models:
            return len(self.eligible(i, demand)) >= demand.count
        return True
