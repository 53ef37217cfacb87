"""The core's inputs made from the platform's records: a node from its heartbeat, a job's request from its spec.

The scheduler and the submit service's admission check (`services/submit/admission.py`) both turn what they
heard into the core's model here, so that both ask the core's rules about the same nodes and jobs.
"""

from __future__ import annotations

from typing import Protocol

from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobView
from gpuyard.shared.scheduling.model import ANY_PYTHON, Gpu, JobRequest, Node


class NodeMarks(Protocol):
    """What the admins and the node's monitor said of a node (`NodeControl`, read from the event store)."""

    @property
    def cordoned(self) -> bool: ...

    def usable(self, index: int) -> bool: ...


def node_of(hb: NodeHeartbeat, marks: NodeMarks | None = None) -> Node:
    """The core's node: a cordoned node is not schedulable, an unhealthy or cordoned GPU not usable (no marks:
    every node and GPU in service)."""
    return Node(
        name=hb.node,
        gpus=[
            Gpu(g.index, g.model, g.memory_bytes, g.uuid, usable=marks is None or marks.usable(g.index))
            for g in hb.gpus
        ],
        cpus=hb.cpus,
        memory=hb.memory_bytes,
        schedulable=marks is None or not marks.cordoned,
        pythons=frozenset(hb.pythons),
    )


def request_of(
    spec: JobSpec,
    *,
    job_id: str = "",
    tenant: str = "",
    user: str = "",
    submitted_at: float = 0.0,
    not_before: float | None = None,
) -> JobRequest:
    """The core's request of a job's spec (resources per replica)."""
    r = spec.resources
    return JobRequest(
        job_id=job_id,
        tenant=tenant,
        user=user,
        gpus=r.gpus,
        replicas=spec.replicas,
        cpus=r.cpus,
        memory=r.memory,
        gpu_memory=r.gpu_memory,
        gpu_models=tuple(r.gpu_model),
        priority=spec.priority_value,
        submitted_at=submitted_at,
        timeout=spec.timeout,
        not_before=not_before,
        python=wanted_python(spec),
    )


def wanted_python(spec: JobSpec) -> str:
    """The Python version a job's own environment is built for (ANY_PYTHON: the node's default), "" for a job
    without one (or with an image: the Kubernetes backend's)."""
    env = spec.environment
    if env is None or not env.wants_build:
        return ""
    return env.python or ANY_PYTHON


def job_request(view: JobView) -> JobRequest:
    """The core's request of a stored job."""
    return request_of(
        view.spec,
        job_id=view.job_id,
        tenant=view.tenant,
        user=view.user,
        submitted_at=view.created_at.timestamp(),
        not_before=view.not_before.timestamp() if view.not_before else None,
    )
