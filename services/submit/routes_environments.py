"""Job environments on the nodes (`gpuyard envs`, `gpuyard envs rm`): what each node holds, from its heartbeat,
and an admin's removal, a `node.environment_remove` event its executor acts on (docs/environments.md).

Every tenant sees every environment's key, Python, packages, size and use: an environment is shared by the jobs
of every tenant that ask for the same packages (its key is their content hash), and its packages are public
ones by name (a requirement's URL is never announced: the node says the package's name only). Removal is the
admins': refused (409) while a running replica uses it."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, status

from gpuyard.services.submit.auth import Admin, Context, CurrentPrincipal
from gpuyard.services.submit.errors import answers
from gpuyard.shared.contracts.api.environments import (
    EnvironmentListOut,
    EnvironmentOut,
    EnvironmentRemovedOut,
    NodePythonsOut,
)
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import EnvironmentRemoveRequested

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/environments", tags=["environments"], responses=answers(400, 401, 403, 413))
EnvironmentKey = Annotated[
    str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$", examples=["3f2a9c"])
]
NodeName = Annotated[
    str | None, Query(max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="One node only.")
]


def held(ctx, node: str | None = None) -> list[EnvironmentOut]:
    """The environments of the nodes heard from lately (of one node: `node`), the most recently used first."""
    out = [
        EnvironmentOut(node=hb.node, **env.model_dump())
        for hb in ctx.telemetry.live_nodes()
        if node is None or hb.node == node
        for env in hb.environments
    ]
    return sorted(out, key=lambda e: (e.last_used is None, -(e.last_used.timestamp() if e.last_used else 0)))


@router.get("", response_model=EnvironmentListOut)
async def list_environments(ctx: Context, _principal: CurrentPrincipal, node: NodeName = None):
    """The job environments each node holds (key, Python, packages, size, last used, replicas using it), and
    the Python versions each node builds for."""
    nodes = [
        NodePythonsOut(node=hb.node, pythons=hb.pythons)
        for hb in sorted(ctx.telemetry.live_nodes(), key=lambda hb: hb.node)
        if node is None or hb.node == node
    ]
    return EnvironmentListOut(items=held(ctx, node), nodes=nodes)


@router.delete(
    "/{key}",
    response_model=EnvironmentRemovedOut,
    responses=answers(404, 409, 503),
    status_code=status.HTTP_202_ACCEPTED,
)
async def remove_environment(ctx: Context, principal: Admin, key: EnvironmentKey, node: NodeName = None):
    """Remove an environment from the nodes that hold it (one node: `node`), admin only: 409 while a running
    replica uses it, 404 when no node holds it. Its nodes' executors delete it (a later job that wants it
    builds it again)."""
    found = sorted((e for e in held(ctx, node) if e.key == key), key=lambda e: e.node)
    if not found:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            f"node {node} holds no environment {key}"
            if node
            else f"no node heard from lately holds environment {key} (gpuyard envs lists them)",
        )
    busy = [e for e in found if e.in_use]
    if busy:
        using = ", ".join(f"{e.node} ({e.in_use} replica{'s' if e.in_use != 1 else ''})" for e in busy)
        raise HTTPException(status.HTTP_409_CONFLICT, f"environment {key} is in use by running jobs: {using}")
    if ctx.bus is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the bus is not reachable: try again")
    for env in found:
        event = EnvironmentRemoveRequested(node=env.node, key=key, by=principal.name)
        await ctx.bus.publish(make_event(event, source=ctx.ledger.source))
    log.info(
        "environment %s: removal asked by %s on %s", key, principal.name, ", ".join(e.node for e in found)
    )
    return EnvironmentRemovedOut(
        key=key, nodes=[e.node for e in found], size_bytes=sum(e.size_bytes for e in found)
    )
