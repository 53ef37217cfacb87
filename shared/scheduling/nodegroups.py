"""Nodes grouped by everything a placement decision reads, so that a policy scores one node per group (`NodeGroups`,
built by the capacity index once a replica fits on many nodes)."""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

from gpuyard.shared.scheduling.demand import Demand
from gpuyard.shared.scheduling.model import EPS

if TYPE_CHECKING:
    from gpuyard.shared.scheduling.index import CapacityIndex


class NodeGroups:
    """Nodes grouped by everything a placement decision reads, so a policy scores one node per group.

    Key: (GPU state id, free CPUs, free memory, and either the GPUs' memory size when every GPU of the node is
    the same model with the same memory and no memory slice is handed out, or else the sorted per-GPU tuples
    (free milli-GPU, model, memory, free memory)). Per group, numpy arrays hold the filter values and the
    representative (lowest node position, kept with a lazily cleaned heap); a node moves between groups on
    every change of its free capacity. Unschedulable nodes belong to no group. Group ids of emptied groups are
    reused, so the arrays stay about as long as the number of distinct node states.
    """

    __slots__ = (
        "index",
        "keys",
        "key_of",
        "count",
        "heaps",
        "spare",
        "top",
        "cpu_free",
        "mem_free",
        "idle",
        "max_free",
        "max_memory_free",
        "rep",
        "active",
        "plain",
    )

    def __init__(self, index: CapacityIndex) -> None:
        self.index = index
        self.keys: dict[tuple, int] = {}
        self.key_of: list[tuple | None] = []
        self.count: list[int] = []
        self.heaps: list[list[int]] = []
        self.spare: list[int] = []
        self.top = 0  # group ids in use are < top
        size = 64
        self.cpu_free = np.zeros(size, dtype=np.float64)
        self.mem_free = np.zeros(size, dtype=np.float64)
        self.idle = np.zeros(size, dtype=np.int32)
        self.max_free = np.zeros(size, dtype=np.int32)
        self.max_memory_free = np.zeros(size, dtype=np.float64)
        self.rep = np.zeros(size, dtype=np.int64)
        self.active = np.zeros(size, dtype=bool)
        # per node: its GPUs' memory when all its GPUs are alike (same model and memory), else None
        self.plain: list[float | None] = [
            (
                mems[0]
                if mems and all(m == models[0] for m in models) and all(x == mems[0] for x in mems)
                else None
            )
            for models, mems in zip(index.gpu_models, index.gpu_memory_total, strict=True)
        ]
        index.group[:] = -1
        for i in range(len(index)):
            if index.schedulable[i]:
                self._join(i, self.key(i))

    def key(self, i: int) -> tuple:
        ix = self.index
        mems = ix.gpu_memory_free[i]
        plain = self.plain[i]
        if plain is not None and mems == ix.gpu_memory_total[i]:
            extra: object = plain
        else:
            extra = tuple(
                sorted(zip(ix.free[i], ix.gpu_models[i], ix.gpu_memory_total[i], mems, strict=True))
            )
        return (int(ix.state[i]), float(ix.cpu_free[i]), float(ix.mem_free[i]), extra)

    def update(self, i: int) -> None:
        ix = self.index
        g = int(ix.group[i])
        if not ix.schedulable[i]:
            if g >= 0:
                self._leave(i, g)
            return
        key = self.key(i)
        if g >= 0:
            if self.key_of[g] == key:
                return
            self._leave(i, g)
        self._join(i, key)

    def _join(self, i: int, key: tuple) -> None:
        g = self.keys.get(key)
        if g is None:
            g = self._new(key, i)
        self.count[g] += 1
        heapq.heappush(self.heaps[g], i)
        if i < self.rep[g]:
            self.rep[g] = i
        self.index.group[i] = g

    def _new(self, key: tuple, i: int) -> int:
        if self.spare:
            g = self.spare.pop()
        else:
            g = self.top
            self.top += 1
            if g >= self.rep.shape[0]:
                self._grow()
            self.key_of.append(None)
            self.count.append(0)
            self.heaps.append([])
        ix = self.index
        self.keys[key] = g
        self.key_of[g] = key
        self.count[g] = 0
        self.heaps[g] = []
        self.cpu_free[g] = ix.cpu_free[i]
        self.mem_free[g] = ix.mem_free[i]
        self.idle[g] = ix.idle[i]
        self.max_free[g] = ix.max_free[i]
        self.max_memory_free[g] = ix.max_memory_free[i]
        self.rep[g] = i
        self.active[g] = True
        return g

    def _leave(self, i: int, g: int) -> None:
        group = self.index.group
        group[i] = -1
        self.count[g] -= 1
        if not self.count[g]:
            key = self.key_of[g]
            assert key is not None  # (a group in use has its key: `_join` set it)
            del self.keys[key]
            self.key_of[g] = None
            self.heaps[g] = []
            self.active[g] = False
            self.spare.append(g)
            return
        heap = self.heaps[g]
        if len(heap) > 2 * self.count[g] + 16:  # drop stale entries now and then
            heap[:] = sorted({x for x in heap if group[x] == g})
        while group[heap[0]] != g:
            heapq.heappop(heap)
        self.rep[g] = heap[0]

    def _grow(self) -> None:
        size = 2 * self.rep.shape[0]
        for name in ("cpu_free", "mem_free", "idle", "max_free", "max_memory_free", "rep", "active"):
            old = getattr(self, name)
            new = np.zeros(size, dtype=old.dtype)
            new[: old.shape[0]] = old
            setattr(self, name, new)

    def candidates(self, demand: Demand) -> np.ndarray:
        """Representatives (in node order) of the groups where one replica fits now."""
        top = self.top
        mask = (
            self.active[:top]
            & (self.cpu_free[:top] >= demand.cpus - EPS)
            & (self.mem_free[:top] >= demand.memory)
        )
        if demand.count:
            if demand.whole:
                mask &= self.idle[:top] >= demand.count
            else:
                mask &= self.max_free[:top] >= demand.milli
                if demand.gpu_memory:
                    mask &= self.max_memory_free[:top] >= demand.gpu_memory
            if demand.models:
                mask &= self.index.model_mask(demand.models)[self.rep[:top]]
        found = np.sort(self.rep[:top][mask])
        if demand.count and found.size and (demand.gpu_memory or demand.models):
            index = self.index
            exact = [i for i in found.tolist() if len(index.eligible(i, demand)) >= demand.count]
            found = np.asarray(exact, dtype=np.int64)
        return found
