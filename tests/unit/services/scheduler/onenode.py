"""A leading scheduler service over an event store, with one node `n` of two 80 GiB GPUs, and jobs of tenant
`t` of one GPU each recorded as the other services record them."""

from __future__ import annotations

import time
from datetime import datetime
from types import SimpleNamespace

from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.contracts.events.jobs import (
    GpuShare,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.stores.ledger import JobLedger

GIB = 1 << 30


async def leader(store, **settings) -> SchedulerService:
    """The service, leading, after its first load; `settings`: SchedulerSettings fields (pending_after is 0)."""
    service = SimpleNamespace(
        ledger=JobLedger(store, None, "/scheduler"),
        store=store,
        bus=SimpleNamespace(js=None, replicas=1),
        source="/scheduler",
    )
    s = SchedulerService(service, SchedulerSettings(**{"pending_after": 0, **settings}))
    heartbeat = NodeHeartbeat(
        node="n",
        gpus=[GpuInfo(index=i, uuid=f"GPU-{i}", model="H100", memory_bytes=80 * GIB) for i in range(2)],
        cpus=16,
        memory_bytes=64 * GIB,
    )
    s.view.observe_node(heartbeat, now=time.time())
    await s.load()
    s.leading.set()
    return s


async def submit(store, job_id: str, priority: str | None = None) -> None:
    spec = JobSpec(command="sleep 600", resources={"gpus": 1}, **({"priority": priority} if priority else {}))
    data = JobSubmitted(job_id=job_id, name=job_id, tenant="t", user="u", spec=spec)
    await JobLedger(store, None, "/submit").append(job_id, data)


async def running_on(store, job_id: str, gpu: int, priority: str | None = None) -> datetime:
    """The job placed on GPU `gpu` of node n and started; when it started."""
    await submit(store, job_id, priority)
    placement = ReplicaPlacement(replica=0, node="n", gpus=[GpuShare(index=gpu, uuid=f"GPU-{gpu}")])
    await JobLedger(store, None, "/scheduler").append(
        job_id, JobPlaced(job_id=job_id, attempt=1, placements=[placement])
    )
    started = JobStarted(job_id=job_id, attempt=1, node="n", replicas=[0])
    outcome = await JobLedger(store, None, "/executor").append(job_id, started)
    return outcome.view.started_at
