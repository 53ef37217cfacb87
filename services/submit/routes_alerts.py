"""/v1/alerts: the alerts active and recent (docs/alerts.md), as the monitor recorded them in the event store.

A tenant sees the alerts about its own jobs; an admin sees every alert (those about nodes and GPUs too), or one
tenant's with `?tenant=`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, status

from gpuyard.services.submit.auth import Context, CurrentPrincipal
from gpuyard.services.submit.errors import answers
from gpuyard.services.submit.paging import Cursor, api_cursor, store_cursor
from gpuyard.shared.contracts.api.alerts import AlertListOut, AlertStates
from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN
from gpuyard.shared.stores.readmodels.alertbook import ACTIVE, RESOLVED, alert_out, list_alerts

router = APIRouter(prefix="/v1/alerts", tags=["alerts"], responses=answers(400, 401, 413, 503))

STATES = {AlertStates.ACTIVE: [ACTIVE], AlertStates.RESOLVED: [RESOLVED], AlertStates.ALL: [ACTIVE, RESOLVED]}


@router.get("", response_model=AlertListOut, responses=answers(403))
async def get_alerts(
    ctx: Context,
    principal: CurrentPrincipal,
    state: Annotated[
        AlertStates, Query(description="active (raised, not resolved), resolved, or all of them.")
    ] = AlertStates.ALL,
    kind: Annotated[
        str | None, Query(pattern=r"^[a-z][a-z0-9_]{0,63}$", description="Only this rule's: gpu_idle, …")
    ] = None,
    tenant: Annotated[
        str | None,
        Query(pattern=NAME_PATTERN, description="Only this tenant's (admins; a tenant sees its own)."),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Cursor = None,
) -> AlertListOut:
    """Alerts newest first: those still active and those resolved (kept as long as the event store keeps them)."""
    if not principal.admin:
        if tenant not in (None, principal.tenant):
            raise HTTPException(status.HTTP_403_FORBIDDEN, f"your token is for tenant {principal.tenant!r}")
        tenant = principal.tenant
    views, next_cursor = await list_alerts(
        ctx.store, states=STATES[state], tenant=tenant, kind=kind, limit=limit, cursor=store_cursor(cursor)
    )
    return AlertListOut(items=[alert_out(v) for v in views], next_cursor=api_cursor(next_cursor))
