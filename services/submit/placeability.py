"""Whether a job could ever be placed on the cluster its nodes' heartbeats describe, were every node empty.

The submit service refuses a job no node could ever hold (as Slurm refuses a request no partition can
satisfy) with this reason, unless `GPUYARD_ACCEPT_UNPLACEABLE` keeps such jobs waiting for a cluster that
grows. The rule is the scheduler's own: `never_fits` (shared/scheduling/explain.py), asked on the core's index
of the nodes heard from lately (`shared/scheduling/inputs.py`), every node in service.
"""

from __future__ import annotations

from gpuyard.services.submit.telemetry import Telemetry
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.scheduling.demand import demand_of
from gpuyard.shared.scheduling.explain import never_fits
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.inputs import node_of, request_of
from gpuyard.shared.scheduling.model import ClusterState

LOCAL, KUBERNETES = "local", "kubernetes"
"""The backends a node's heartbeat names (its `backend` label)."""
MEMO_MAX = 256
"""Answers kept per job shape, and facts the index keeps per shape asked (GPUs per node of a model and
memory): dropped past this many, so that specs of ever new shapes cannot make them grow without end."""


class Placeability:
    """The core's index of the live nodes, built again only when they change (a node heard from or gone
    silent, its GPUs, CPUs or memory changed), with the answer for each job shape asked on it (a flood of
    alike jobs asks the rule once)."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry
        self._held: tuple[tuple, CapacityIndex] | None = None
        self._answers: dict[tuple, str | None] = {}

    def backend_error(self, spec: JobSpec) -> str | None:
        """Why the job's environment is of a kind no node's backend runs (the `backend` label of the nodes heard
        from lately): an image where every node is of the local backend, packages to build where every node
        is of the Kubernetes backend. None: some node runs it, or none is heard from yet."""
        env = spec.environment
        backends = {hb.labels.get("backend", LOCAL) for hb in self.telemetry.live_nodes()}
        if env is None or not backends:
            return None
        if not env.wants_build and KUBERNETES not in backends:
            return (
                "environment.image: the local backend runs no images; give the environment's packages instead "
                "(`pip: [...]`, `python`: docs/environments.md)"
            )
        if env.wants_build and backends == {KUBERNETES}:
            return (
                "environment: the Kubernetes backend runs the job in an image; give one (`image: ...`) that "
                "holds these packages"
            )
        return None

    def why_not(self, spec: JobSpec) -> str | None:
        """Why no node heard from lately could ever hold the job's replicas (all at once), or None when one
        could, or when no node is heard from (nothing can be said yet)."""
        nodes = self.telemetry.live_nodes()
        if not nodes:
            return None
        key = (self.telemetry.node_shapes, tuple(hb.node for hb in nodes))
        if self._held is None or self._held[0] != key:
            state = ClusterState(nodes={hb.node: node_of(hb) for hb in nodes})
            self._held = (key, CapacityIndex.from_state(state))
            self._answers.clear()
        job = request_of(spec)
        if job.key in self._answers:
            return self._answers[job.key]
        index = self._held[1]
        if len(self._answers) >= MEMO_MAX or len(index.memo) >= MEMO_MAX:
            self._answers.clear()
            index.memo.clear()
        blocker = never_fits(index, job, demand_of(job))
        why = self._answers[job.key] = None if blocker is None else blocker.text
        return why
