"""The scheduler of a caller that keeps its cluster between cycles (the live service).

`schedule(state, queue, config)` builds the capacity index and counts the running jobs from a snapshot in
every cycle. A `Scheduler` holds them instead and is told what changed: the nodes (`put_node`, `drop_node`)
and what each job holds (`put`, `drop`). Its cycle, `schedule(queue, now, quotas)`, decides exactly what
`schedule` decides on `snapshot()`: the same nodes and running jobs, in the order they were put (a job whose
allocation changed counts as put anew).

At the start of a cycle, the free capacity of each node whose allocations changed since the last cycle is
recomputed from what is put on it, read exactly as `CapacityIndex.from_state` reads a snapshot's node, so
nothing drifts; a change of the nodes themselves rebuilds the index. A cycle's placements are decisions, not
allocations: the caller `put`s each job it records as placed, and any placement not put by the next cycle is
given back then.
"""

from __future__ import annotations

from services.scheduler.core.cycle import allocate, decide
from services.scheduler.core.index import CapacityIndex
from services.scheduler.core.model import (
    Allocation,
    ClusterState,
    CycleResult,
    Gpu,
    JobRequest,
    Node,
    SchedulerConfig,
)
from services.scheduler.core.quota import RunningKinds


class Scheduler:
    def __init__(self, config: SchedulerConfig | None = None) -> None:
        self.config = config or SchedulerConfig()
        self.nodes: dict[str, Node] = {}  # inventory, allocations not applied
        self.running: dict[str, Allocation] = {}  # job id -> what it holds, in the order put
        self.kinds = RunningKinds()
        self._on: dict[str, list[str]] = {}  # node -> the jobs holding something on it, in the order put
        self._index: CapacityIndex | None = None
        self._changed: set[str] = set()  # nodes to recompute: changed since the last cycle, or placed on

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
    def schedule(
        self, queue: list[JobRequest], now: float, quotas: dict[str, float] | None = None
    ) -> CycleResult:
        """One cycle: placements, preemptions and reasons, as `schedule(self.snapshot(now, quotas), queue,
        self.config)` decides them."""
        index = self._index
        if index is None:
            index = self._index = CapacityIndex.from_state(self.snapshot())
        else:
            for name in self._changed:
                i = index.position.get(name)
                if i is not None:
                    index.set_node(i, self._applied(name))
        try:
            result = decide(index, list(self.running.values()), queue, self.config, quotas, now, self.kinds)
        except BaseException:
            self._index = None  # it may hold part of a decision
            raise
        self._changed = {r.node for p in result.placements for r in p.replicas}
        return result

    def snapshot(self, now: float = 0.0, quotas: dict[str, float] | None = None) -> ClusterState:
        """The cluster as `schedule` takes it: the nodes with what was put applied, and the running jobs."""
        nodes = {name: self._applied(name) for name in self.nodes}
        return ClusterState(nodes, list(self.running.values()), dict(quotas or {}), now)

    def _applied(self, name: str) -> Node:
        node = self.nodes[name]
        gpus = [Gpu(g.index, g.model, g.memory, g.uuid) for g in node.gpus]
        out = Node(name, gpus, node.cpus, node.memory, schedulable=node.schedulable)
        running = self.running
        allocate(out, [r for job in self._on.get(name, ()) for r in running[job].replicas if r.node == name])
        return out


def _nodes(alloc: Allocation) -> set[str]:
    return {r.node for r in alloc.replicas}
