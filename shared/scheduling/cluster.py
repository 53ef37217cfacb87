"""The cluster as a caller keeps it between cycles (the live service): nodes, what each job holds, and the
capacity index that `decide` reads, kept up to date instead of rebuilt from a snapshot every cycle.

A `HeldCluster` is told what changed: the nodes (`put_node`, `drop_node`) and what each job holds (`put`,
`drop`). A cycle is `decide(held.index(), held.allocations(), queue, config, quotas, now, held.kinds)`, then
`held.decided(result)`: it decides exactly what `decide` decides on an index built from `snapshot()`, the same
nodes and running jobs in the order they were put (a job whose allocation changed counts as put anew).

`index()` recomputes the free capacity of each node whose allocations changed since the last cycle from what
is put on it, read exactly as `CapacityIndex.from_state` reads a snapshot's node, so nothing drifts; a change
of the nodes themselves rebuilds the index. A cycle's placements are decisions, not allocations: the caller
`put`s each job it records as placed, and any placement not put by the next cycle is given back then. A cycle
that did not reach `decided` (it raised) leaves an index that may hold part of a decision: the next one
rebuilds it.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.model import (
    Allocation,
    ClusterState,
    CycleResult,
    Gpu,
    Node,
    ReplicaAssignment,
)
from gpuyard.shared.scheduling.quota import RunningKinds


class HeldCluster:
    def __init__(self) -> None:
        self.nodes: dict[str, Node] = {}  # inventory, allocations not applied
        self.running: dict[str, Allocation] = {}  # job id -> what it holds, in the order put
        self.kinds = RunningKinds()
        self._on: dict[str, list[str]] = {}  # node -> the jobs holding something on it, in the order put
        self._index: CapacityIndex | None = None
        self._changed: set[str] = set()  # nodes to recompute: changed since the last cycle, or placed on
        self._deciding = False  # between `index()` and `decided()`

    # ------------------------------------------------------------------------------------------- changes
    def put_node(self, node: Node) -> None:
        """A node as it is now: new, changed or the same as before (then nothing happens). Its allocated fields
        are not read (what jobs hold is `put`); the node must not be changed afterwards."""
        if self.nodes.get(node.name) != node:
            self.nodes[node.name] = node
            self._index = None

    def drop_node(self, name: str) -> None:
        if self.nodes.pop(name, None) is not None:
            self._index = None

    def put(self, alloc: Allocation) -> None:
        """A job holds resources now (placed or running), or what is known of it changed."""
        job_id = alloc.job.job_id
        old = self.running.get(job_id)
        if old is not None and old.replicas == alloc.replicas:
            self.running[job_id] = alloc
            self.kinds.add(old.job, -1)
            self.kinds.add(alloc.job)
            return
        self.drop(job_id)
        self.running[job_id] = alloc
        self.kinds.add(alloc.job)
        for name in _nodes(alloc):
            self._on.setdefault(name, []).append(job_id)
            self._changed.add(name)

    def drop(self, job_id: str) -> None:
        """The job holds nothing any more (it ended, or went back to the queue)."""
        old = self.running.pop(job_id, None)
        if old is None:
            return
        self.kinds.add(old.job, -1)
        for name in _nodes(old):
            jobs = self._on[name]
            jobs.remove(job_id)
            if not jobs:
                del self._on[name]
            self._changed.add(name)

    # ------------------------------------------------------------------------------------------- cycle
    def index(self) -> CapacityIndex:
        """The capacity index for the next `decide`, up to date with every change told since the last cycle."""
        index = self._index
        if index is None or self._deciding:
            index = self._index = CapacityIndex.from_state(self.snapshot())
        else:
            for name in self._changed:
                i = index.position.get(name)
                if i is not None:
                    index.set_node(i, self._applied(name))
        self._changed = set()
        self._deciding = True
        return index

    def allocations(self) -> list[Allocation]:
        """The running jobs, in the order they were put (`decide`'s `running`)."""
        return list(self.running.values())

    def decided(self, result: CycleResult) -> None:
        """`decide` ran on `index()`: the nodes it placed on are recomputed at the next cycle (what the caller
        did not `put` by then is given back)."""
        self._changed = {r.node for p in result.placements for r in p.replicas}
        self._deciding = False

    def snapshot(self, now: float = 0.0, quotas: dict[str, float] | None = None) -> ClusterState:
        """The cluster as a snapshot: the nodes with what was put applied, and the running jobs."""
        nodes = {name: self._applied(name) for name in self.nodes}
        return ClusterState(nodes, list(self.running.values()), dict(quotas or {}), now)

    def _applied(self, name: str) -> Node:
        node = self.nodes[name]
        gpus = [Gpu(g.index, g.model, g.memory, g.uuid, usable=g.usable) for g in node.gpus]
        out = Node(name, gpus, node.cpus, node.memory, schedulable=node.schedulable, pythons=node.pythons)
        running = self.running
        allocate(out, [r for job in self._on.get(name, ()) for r in running[job].replicas if r.node == name])
        return out


def _nodes(alloc: Allocation) -> set[str]:
    return {r.node for r in alloc.replicas}


def allocate(node: Node, replicas: Iterable[ReplicaAssignment]) -> None:
    """Add what these replicas (on this node) hold to its allocations (a GPU the node does not list is skipped)."""
    by_index = {g.index: g for g in node.gpus}
    for r in replicas:
        node.allocated_cpus += r.cpus
        node.allocated_memory += r.memory
        for a in r.gpus:
            gpu = by_index.get(a.index)
            if gpu is not None:
                gpu.allocated = min(1.0, gpu.allocated + a.fraction)
                gpu.allocated_memory += a.memory or 0
