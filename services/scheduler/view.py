"""The scheduler's view of the cluster: nodes from heartbeats, jobs from the event store.

It keeps the core's `HeldCluster` (the capacity index and the running jobs, held between cycles) told of every
change, and turns the queued jobs into the core's queue; no decisions here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpuyard.shared.contracts.events.jobs import GpuShare, ReplicaPlacement
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, JobState, JobView
from gpuyard.shared.scheduling import (
    Allocation,
    GpuAssignment,
    HeldCluster,
    HeldQueue,
    JobRequest,
    ReplicaAssignment,
)
from gpuyard.shared.scheduling.inputs import job_request, node_of
from gpuyard.shared.stores.readmodels.nodecontrol import NodeControl


@dataclass(slots=True)
class NodeRecord:
    heartbeat: NodeHeartbeat
    last_seen: float


def to_assignment(p: ReplicaPlacement) -> ReplicaAssignment:
    return ReplicaAssignment(
        replica=p.replica,
        node=p.node,
        gpus=tuple(GpuAssignment(g.index, g.fraction, g.memory_bytes) for g in p.gpus),
        cpus=p.cpus,
        memory=p.memory_bytes,
    )


def to_placement(a: ReplicaAssignment, node: NodeHeartbeat | None) -> ReplicaPlacement:
    uuids = {g.index: g.uuid for g in node.gpus} if node else {}
    return ReplicaPlacement(
        replica=a.replica,
        node=a.node,
        gpus=[
            GpuShare(index=g.index, uuid=uuids.get(g.index), fraction=g.fraction, memory_bytes=g.memory)
            for g in a.gpus
        ],
        cpus=a.cpus,
        memory_bytes=a.memory,
    )


def checkpointed_at(view: JobView, started: float) -> float | None:
    """When the job's latest checkpoint was saved, for the core (`Allocation.checkpointed_at`): None without
    one; `started` (the current attempt's start) when an earlier attempt saved it, or it says it was saved
    before; never later than the platform recorded it (the job's clock may be ahead)."""
    saved = view.checkpoint
    if saved is None:
        return None
    if saved.attempt < view.attempt:
        return started
    at = saved.saved_at.timestamp()
    if saved.reported_at is not None:
        at = min(at, saved.reported_at.timestamp())
    return max(started, at)


class ClusterView:
    def __init__(self) -> None:
        self.nodes: dict[str, NodeRecord] = {}
        self.controls: dict[str, NodeControl] = {}
        """Each node's cordons and unhealthy GPUs (`gpuyard.shared.stores.readmodels.nodecontrol`), kept across its heartbeats."""
        self.jobs: dict[str, JobView] = {}  # queued, placed and running jobs only
        self._requests: dict[str, tuple[int, JobRequest]] = {}  # job -> (view version, the core's request)
        self.queued_since: dict[str, float] = {}
        """When each queued job's current attempt was queued (a timestamp, read on every cycle)."""
        self.held = HeldCluster()
        self.waiting = HeldQueue()
        """The queued jobs not asked to cancel, told of every change (the core's queue, kept ordered)."""
        self.left_queue: set[str] = set()
        """Jobs that left the queue since the caller last emptied this set (placed, cancelled, ended)."""

    def observe_node(self, hb: NodeHeartbeat, now: float | None = None) -> bool:
        """Returns True when the node is new (or its inventory changed)."""
        old = self.nodes.get(hb.node)
        self.nodes[hb.node] = NodeRecord(hb, now or time.time())
        self.held.put_node(node_of(hb, self.controls.get(hb.node)))  # nothing happens when it is unchanged
        return old is None or old.heartbeat.gpus != hb.gpus

    def control(self, control: NodeControl) -> None:
        """A node's controls as the event store holds them now (newer than any known before)."""
        self.controls[control.node] = control
        rec = self.nodes.get(control.node)
        if rec is not None:
            self.held.put_node(node_of(rec.heartbeat, control))

    def lost_nodes(self, timeout: float, now: float | None = None) -> list[NodeRecord]:
        now = now or time.time()
        return [r for r in self.nodes.values() if now - r.last_seen > timeout]

    def forget_node(self, name: str) -> None:
        self.nodes.pop(name, None)
        self.held.drop_node(name)

    def put_job(self, view: JobView) -> None:
        """Keep the newer of what is known and `view` (reads and own writes may arrive out of order)."""
        known = self.jobs.get(view.job_id)
        if known is not None and known.version > view.version:
            return
        if view.state.terminal:
            self.jobs.pop(view.job_id, None)
            self._requests.pop(view.job_id, None)
            self.queued_since.pop(view.job_id, None)
            self.held.drop(view.job_id)
            self._unqueue(view.job_id)
            return
        self.jobs[view.job_id] = view
        if view.state == JobState.QUEUED:
            self.queued_since[view.job_id] = view.current.queued_at.timestamp()
            self.held.drop(view.job_id)
            if view.cancel_requested:
                self._unqueue(view.job_id)
            else:
                self.waiting.put(self.request(view))
        else:
            self.queued_since.pop(view.job_id, None)
            self.held.put(self.allocation(view))
            self._unqueue(view.job_id)

    def _unqueue(self, job_id: str) -> None:
        self.waiting.drop(job_id)
        self.left_queue.add(job_id)

    def request(self, view: JobView) -> JobRequest:
        """The core's request for a job, converted once per version of the job."""
        cached = self._requests.get(view.job_id)
        if cached is None or cached[0] != view.version:
            cached = (view.version, job_request(view))
            self._requests[view.job_id] = cached
        return cached[1]

    def allocation(self, view: JobView) -> Allocation:
        replicas = tuple(to_assignment(p) for p in view.placements)
        started = (view.started_at or view.updated_at).timestamp()
        return Allocation(
            self.request(view), replicas, started, view.borrowed, checkpointed_at(view, started)
        )

    def jobs_on(self, node: str) -> list[JobView]:
        return [
            j
            for j in self.jobs.values()
            if j.state in ACTIVE_STATES and any(p.node == node for p in j.placements)
        ]

    def jobs_on_gpus(self, node: str, gpus: set[int]) -> list[JobView]:
        """The active jobs holding any of these GPUs of `node`."""
        return [
            j
            for j in self.jobs_on(node)
            if any(p.node == node and any(g.index in gpus for g in p.gpus) for p in j.placements)
        ]

    def queue(self) -> list[JobRequest]:
        """The queued jobs as a list (the held `waiting` is what a cycle reads)."""
        return [
            self.request(v)
            for v in self.jobs.values()
            if v.state == JobState.QUEUED and not v.cancel_requested
        ]
