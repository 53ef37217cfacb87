"""Free capacity of every node, indexed for fast placement.

Per node, numpy arrays hold what a vectorised filter needs (free CPUs, memory, idle GPUs, largest free share,
GPU state id); per GPU, plain lists hold the free milli-GPU and free memory (the placement code touches one node
at a time). `take`/`give` keep both in step. Built from a `ClusterState` once per cycle, or kept alive across
events by the trace simulator: the same code places jobs in both.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter

import numpy as np

from gpuyard.shared.scheduling.demand import MILLI, Demand, share_to_milli, used_to_milli
from gpuyard.shared.scheduling.gpustate import STATES, GpuStateTable
from gpuyard.shared.scheduling.model import ANY_PYTHON, EPS, ClusterState, Node, ReplicaAssignment
from gpuyard.shared.scheduling.nodegroups import NodeGroups

MIXED = -2  # model id of a node whose GPUs are not all the same model
GROUP_FROM = 64  # node groups are built once a replica fits on more nodes than this


_GPU = attrgetter("model", "memory", "index", "allocated", "allocated_memory")


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
        "blocked",
        "states",
        "_model_masks",
        "memo",
        "restrict",
        "grouped",
        "group",
        "_groups",
        "pythons",
        "_python_masks",
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
        free: Sequence[Sequence[int]] | None = None,
        used_memory: Sequence[Sequence[float]] | None = None,
        used_cpus: Sequence[float] | None = None,
        used_mem: Sequence[float] | None = None,
        schedulable: Sequence[bool] | None = None,
        blocked: dict[int, frozenset[int]] | None = None,
        states: GpuStateTable = STATES,
        grouped: bool = True,
        pythons: Sequence[frozenset[str]] | None = None,
    ) -> None:
        n = len(names)
        self.states = states
        self.names = list(names)
        self.position = {name: i for i, name in enumerate(self.names)}
        model_rows = self._gpu_rows(gpu_models, gpu_memory, gpu_ids, used, free, used_memory)
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
        self.blocked: dict[int, frozenset[int]] = dict(blocked or {})
        """Node position -> the GPU slots out of service (unhealthy or cordoned): their free share is held at
        0, whatever is given back on them (a what-if release in a reservation or a preemption trial)."""
        for i, slots in self.blocked.items():
            for slot in slots:
                self.free[i][slot] = 0
        self._node_summaries(model_rows)
        self._model_masks: dict[tuple[str, ...], np.ndarray] = {}
        self.memo: dict = {}  # per-index facts policies derive once (capacity per GPU model, ...)
        self.restrict: np.ndarray | None = None  # extra node mask for placement (None = every node)
        self.grouped = grouped  # place through node groups (built on first use, see `NodeGroups`)
        self.group = np.full(n, -1, dtype=np.int64)
        self._groups: NodeGroups | None = None
        self.pythons: list[frozenset[str]] = list(pythons) if pythons is not None else [frozenset()] * n
        """Per node, the Python versions it builds job environments for (never mutated)."""
        self._python_masks: dict[str, np.ndarray] = {}

    def _gpu_rows(self, gpu_models, gpu_memory, gpu_ids, used, free, used_memory) -> dict[tuple, list[int]]:
        """Per GPU: model ids, memory, indices, free milli-GPU and free memory of every node. Rows that never
        change are shared between nodes with the same GPUs (thousands of alike nodes); returns the model rows."""
        states = self.states
        model_rows: dict[tuple, list[int]] = {}
        memory_rows: dict[tuple, list[float]] = {}
        id_rows: dict[tuple, list[int]] = {}
        self.gpu_models, self.gpu_memory_total, self.gpu_ids = [], [], []
        self.free, self.gpu_memory_free = [], []
        for k in range(len(self.names)):
            models = tuple(gpu_models[k])
            row = model_rows.get(models)
            if row is None:
                row = model_rows[models] = [states.model_id(m) for m in models]
            self.gpu_models.append(row)
            mems = tuple(gpu_memory[k])
            total = memory_rows.get(mems)
            if total is None:
                total = memory_rows[mems] = [float(x) for x in mems]
            self.gpu_memory_total.append(total)
            ids = tuple(gpu_ids[k]) if gpu_ids is not None else tuple(range(len(models)))
            id_row = id_rows.get(ids)
            if id_row is None:
                id_row = id_rows[ids] = list(ids)
            self.gpu_ids.append(id_row)
            if free is not None:
                self.free.append(list(free[k]))
            elif used is not None:
                self.free.append([MILLI - u for u in used[k]])
            else:
                self.free.append([MILLI] * len(models))
            self.gpu_memory_free.append(
                _memory_free(total, used_memory[k] if used_memory is not None else ())
            )
        return model_rows

    def _node_summaries(self, model_rows: dict[tuple, list[int]]) -> None:
        """Per node, what the vectorised filter reads: GPU model (MIXED when they differ), idle GPUs, largest free
        share and free memory slice, GPU state id."""
        kinds = {
            id(m): (m[0] if m and all(x == m[0] for x in m) else (MIXED if m else -1))
            for m in model_rows.values()
        }
        node_model = [kinds[id(m)] for m in self.gpu_models]
        self.node_model = np.array(node_model, dtype=np.int32)
        idle, max_free, max_memory_free, state = [], [], [], []
        intern = self.states.intern
        for row, mems, model in zip(self.free, self.gpu_memory_free, node_model, strict=True):
            idle.append(row.count(MILLI))
            max_free.append(max(row) if row else 0)
            max_memory_free.append(max(mems) if mems else 0.0)
            state.append(intern(model, tuple(sorted(row, reverse=True))))
        self.idle = np.array(idle, dtype=np.int32)
        self.max_free = np.array(max_free, dtype=np.int32)
        self.max_memory_free = np.array(max_memory_free, dtype=np.float64)
        self.state = np.array(state, dtype=np.int64)

    # ----------------------------------------------------------------------------------------------- building
    @classmethod
    def from_state(cls, state: ClusterState) -> CapacityIndex:
        nodes = list(state.nodes.values())
        models, memory, ids, free, used_memory = list(zip(*map(_columns, nodes), strict=True)) or [()] * 5
        return cls(
            [n.name for n in nodes],
            models,
            memory,
            [n.cpus for n in nodes],
            [n.memory for n in nodes],
            gpu_ids=ids,
            free=free,
            used_memory=used_memory,
            used_cpus=[n.allocated_cpus for n in nodes],
            used_mem=[n.allocated_memory for n in nodes],
            schedulable=[n.schedulable for n in nodes],
            blocked=_blocked(nodes),
            pythons=[n.pythons for n in nodes],
        )

    def copy(self) -> CapacityIndex:
        clone = object.__new__(CapacityIndex)
        for name in ("names", "position", "gpu_ids", "gpu_models", "gpu_memory_total", "cpus", "memory"):
            setattr(clone, name, getattr(self, name))  # never mutated
        clone.states = self.states
        clone.node_model = self.node_model
        clone.schedulable = self.schedulable
        clone.blocked = self.blocked
        clone._model_masks = self._model_masks
        clone.pythons = self.pythons
        clone._python_masks = self._python_masks
        clone.memo = self.memo
        clone.restrict = self.restrict
        clone.grouped = False  # short-lived what-if copies (reservations, preemption trials) score every node
        clone.group = self.group
        clone._groups = None
        clone.free = [list(row) for row in self.free]
        clone.gpu_memory_free = [list(row) for row in self.gpu_memory_free]
        for name in ("cpu_free", "mem_free", "idle", "max_free", "max_memory_free", "state"):
            setattr(clone, name, getattr(self, name).copy())
        return clone

    def __len__(self) -> int:
        return len(self.names)

    def set_node(self, i: int, node: Node) -> None:
        """Node i's free capacity as `from_state` reads it from `node` (the same node, its allocations applied)."""
        _models, _memory, _ids, free, used_memory = _columns(node)
        for slot in self.blocked.get(i, ()):
            free[slot] = 0
        self.free[i] = free
        self.gpu_memory_free[i] = _memory_free(self.gpu_memory_total[i], used_memory)
        self.cpu_free[i] = self.cpus[i] - float(node.allocated_cpus)
        self.mem_free[i] = self.memory[i] - float(node.allocated_memory)
        self.refresh(i)
        self.touched(i)

    # ----------------------------------------------------------------------------------------------- queries
    def refresh(self, i: int) -> None:
        """Recompute node i's aggregates after its GPUs changed."""
        row = self.free[i]
        self.idle[i] = row.count(MILLI)
        self.max_free[i] = max(row) if row else 0
        mems = self.gpu_memory_free[i]
        self.max_memory_free[i] = max(mems) if mems else 0.0
        self.state[i] = self.states.intern(int(self.node_model[i]), tuple(sorted(row, reverse=True)))

    def touched(self, i: int) -> None:
        """Node i's free capacity changed (after `refresh` when its GPUs did): move it to its new group."""
        if self._groups is not None:
            self._groups.update(i)

    def model_mask(self, models: tuple[str, ...]) -> np.ndarray:
        mask = self._model_masks.get(models)
        if mask is None:
            wanted = {self.states.model_id(m) for m in models}
            mask = np.array([any(g in wanted for g in row) for row in self.gpu_models], dtype=bool)
            self._model_masks[models] = mask
        return mask

    def python_mask(self, python: str, within: np.ndarray | None = None) -> np.ndarray:
        """The nodes (of `within`, when given) that build job environments for `python` (ANY_PYTHON: for some
        version); made once per version and index (a job's own environment asks it, no parsing per job)."""
        mask = self._python_masks.get(python)
        if mask is None:
            if python == ANY_PYTHON:
                mask = np.array([bool(p) for p in self.pythons], dtype=bool)
            else:
                mask = np.array([python in p for p in self.pythons], dtype=bool)
            self._python_masks[python] = mask
        return mask if within is None else mask & within

    def candidates(self, demand: Demand) -> np.ndarray:
        """Positions of the nodes where one replica fits now (in node order)."""
        mask = (self.cpu_free >= demand.cpus - EPS) & (self.mem_free >= demand.memory) & self.schedulable
        if self.restrict is not None:
            mask &= self.restrict
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

    def placement_candidates(self, demand: Demand) -> np.ndarray:
        """What a placement policy chooses from: one representative node per group of interchangeable nodes
        (the group's lowest position), in node order, for the groups where one replica fits now.

        Nodes of one group have the same free GPUs (up to the order of their slots), GPU models and memory,
        free CPUs and memory, so every policy scores them alike; as every policy breaks ties by the lowest
        position, choosing among representatives gives exactly the node it would choose among all nodes.
        With `restrict` set, or on a copy, every node that fits is a candidate (`candidates`)."""
        if not self.grouped or self.restrict is not None:
            return self.candidates(demand)
        groups = self._groups
        if groups is None:
            found = self.candidates(demand)
            if found.size <= GROUP_FROM:  # few fitting nodes (a full cluster): no need for groups yet
                return found
            groups = self._groups = NodeGroups(self)
        return groups.candidates(demand)

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
            elif value >= demand.milli and (
                not demand.gpu_memory or self.gpu_memory_free[i][s] >= demand.gpu_memory
            ):
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
        self.touched(i)

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
            if i in self.blocked:
                self._hold_blocked(i)
            self.refresh(i)
        self.touched(i)

    def _hold_blocked(self, i: int) -> None:
        free = self.free[i]
        for slot in self.blocked[i]:
            free[slot] = 0

    @property
    def blocked_gpus(self) -> int:
        """GPUs out of service (unhealthy or cordoned) on the schedulable nodes."""
        return sum(len(slots) for i, slots in self.blocked.items() if self.schedulable[i])

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
            if i in self.blocked:
                self._hold_blocked(i)
            self.refresh(i)
            self.touched(i)
            touched.append(i)
        return touched

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
            self.touched(i)

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


def _columns(node: Node) -> tuple[tuple, tuple, tuple, list[int], tuple]:
    """A node's GPUs by column: models, memory, indices, free milli-GPU, memory slices handed out."""
    columns = list(zip(*map(_GPU, node.gpus), strict=False)) or [()] * 5
    allocated = columns[3]
    n = len(allocated)
    if allocated.count(1.0) == n:  # full and idle nodes, the common cases, without a loop
        free = [0] * n
    elif allocated.count(0.0) == n:
        free = [MILLI] * n
    else:
        free = [MILLI if a <= 0 else (0 if a >= 1 else MILLI - used_to_milli(a)) for a in allocated]
    return columns[0], columns[1], columns[2], free, columns[4]


def _blocked(nodes: Sequence[Node]) -> dict[int, frozenset[int]]:
    """Node position -> the slots of its GPUs that are not usable (none for most clusters: one pass)."""
    return {
        i: frozenset(s for s, g in enumerate(n.gpus) if not g.usable)
        for i, n in enumerate(nodes)
        if not all(g.usable for g in n.gpus)
    }


def _memory_free(total: list[float], taken: Sequence[float]) -> list[float]:
    return [t - u for t, u in zip(total, taken, strict=True)] if any(taken) else list(total)
