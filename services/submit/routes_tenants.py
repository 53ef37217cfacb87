"""/v1/tenants: each tenant's quota and load, from the event store (its live jobs' projections)."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from fastapi import APIRouter
from pydantic import TypeAdapter

from gpuyard.services.submit.auth import Context, CurrentPrincipal
from gpuyard.services.submit.errors import answers
from gpuyard.shared.contracts.api.tenants import TenantListOut, TenantOut
from gpuyard.shared.contracts.events.jobs import ReplicaPlacement
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES, JobState, state_values
from gpuyard.shared.reporting.quotause import NOTHING, Holding, held_gpus, quota_use
from gpuyard.shared.stores.events import Projections

router = APIRouter(prefix="/v1/tenants", tags=["tenants"], responses=answers(400, 401, 413, 503))

QUEUED = [JobState.QUEUED.value]
HOLDING = state_values(ACTIVE_STATES)
PAGE = 500
PLACEMENTS = TypeAdapter(list[ReplicaPlacement])


@router.get("", response_model=TenantListOut)
async def list_tenants(ctx: Context, principal: CurrentPrincipal) -> TenantListOut:
    """Each tenant's quota and what it uses of it: guaranteed, used and borrowed GPUs, its jobs queued, placed
    and running, and how long its oldest queued job has waited. A tenant's token sees its own row only; an
    admin's, every tenant that has a quota or a job queued, placed or running."""
    only = None if principal.admin else principal.tenant
    queued = await ctx.store.count_by_tenant(states=QUEUED)
    oldest = await ctx.store.oldest_by_tenant(states=QUEUED)
    holding = [doc async for doc in live_docs(ctx.store, HOLDING, only)]
    use = quota_use(
        Holding(d["tenant"], held_gpus(PLACEMENTS.validate_python(d["placements"])), d["borrowed"])
        for d in holding
    )
    placed = Counter(d["tenant"] for d in holding if d["state"] == JobState.PLACED)
    running = Counter(d["tenant"] for d in holding if d["state"] == JobState.RUNNING)
    tenants = {only} if only is not None else set(ctx.quotas) | set(queued) | set(use)
    now = datetime.now(UTC)
    return TenantListOut(
        items=[
            TenantOut(
                tenant=t,
                guaranteed_gpus=ctx.quotas.get(t, 0.0),
                used_gpus=use.get(t, NOTHING).used,
                borrowed_gpus=use.get(t, NOTHING).borrowed,
                queued=queued.get(t, 0),
                placed=placed.get(t, 0),
                running=running.get(t, 0),
                oldest_queued_seconds=(
                    max(0.0, (now - datetime.fromisoformat(oldest[t])).total_seconds())
                    if t in oldest
                    else None
                ),
            )
            for t in sorted(tenants)
        ]
    )


async def live_docs(store: Projections, states: list[str], tenant: str | None):
    """The projections of the jobs in `states` (of `tenant`'s only, when given), page by page."""
    cursor = None
    while True:
        page = await store.list_projections(states=states, tenant=tenant, limit=PAGE, cursor=cursor)
        for doc in page.items:
            yield doc
        if not (cursor := page.next_cursor):
            return
