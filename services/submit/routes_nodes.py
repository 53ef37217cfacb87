"""Admins cordon, drain and uncordon a node or one GPU of it (`gpuyard nodes cordon|drain|uncordon NODE[/GPU]`),
as `kubectl cordon|drain|uncordon` and `scontrol update State=DRAIN|RESUME` do. Each is a `node.control` event,
recorded in the node's stream of the event store (`gpuyard.shared.stores.readmodels.nodecontrol`) and published; the scheduler acts on
it. docs/operations.md says what each does to running jobs.
"""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, status

from gpuyard.services.submit.auth import Admin, Context
from gpuyard.services.submit.errors import answers
from gpuyard.shared.bus.outbox import publish_recorded
from gpuyard.shared.contracts.api.nodes import NodeControlIn, NodeControlOut
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import NodeAction, NodeControlChanged
from gpuyard.shared.stores.readmodels import nodecontrol
from gpuyard.shared.stores.readmodels.nodecontrol import NodeControl

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/nodes", tags=["nodes"], responses=answers(400, 401, 403, 404, 413))
NodeName = Annotated[
    str, Path(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", examples=["node-1"])
]


def control_out(control: NodeControl) -> NodeControlOut:
    return NodeControlOut(
        node=control.node,
        cordoned=control.cordoned,
        draining=control.draining,
        reason=control.reason,
        by=control.by,
        cordoned_gpus=sorted(i for i, g in control.gpus.items() if g.cordoned),
        draining_gpus=sorted(i for i, g in control.gpus.items() if g.draining),
        unhealthy_gpus=control.unhealthy,
    )


async def _control(
    ctx, principal, node: str, action: NodeAction, body: NodeControlIn | None
) -> NodeControlOut:
    body = body or NodeControlIn()
    known = ctx.telemetry.nodes.get(node)
    if known is None and await nodecontrol.stored(ctx.store, node) is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no node {node!r} (gpuyard nodes lists them)")
    if body.gpu is not None and known is not None and body.gpu not in {g.index for g in known[1].gpus}:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"node {node} has no GPU {body.gpu}")
    event = make_event(
        NodeControlChanged(node=node, gpu=body.gpu, action=action, by=principal.name, reason=body.reason),
        source=ctx.ledger.source,
    )
    control = await nodecontrol.record(ctx.store, event)
    log.info(
        "node %s%s %s by %s", node, "" if body.gpu is None else f"/{body.gpu}", action.value, principal.name
    )
    if ctx.bus is not None:
        await publish_recorded(ctx.bus, event, ctx.store)
    return control_out(control)


@router.post("/{node}/cordon", response_model=NodeControlOut)
async def cordon(ctx: Context, principal: Admin, node: NodeName, body: NodeControlIn | None = None):
    """Nothing new is placed on the node (or the GPU); its running jobs stay (admin only)."""
    return await _control(ctx, principal, node, NodeAction.CORDON, body)


@router.post("/{node}/drain", response_model=NodeControlOut)
async def drain(ctx: Context, principal: Admin, node: NodeName, body: NodeControlIn | None = None):
    """Cordon, and the running jobs there are preempted with their grace period and requeued (admin only)."""
    return await _control(ctx, principal, node, NodeAction.DRAIN, body)


@router.post("/{node}/uncordon", response_model=NodeControlOut)
async def uncordon(ctx: Context, principal: Admin, node: NodeName, body: NodeControlIn | None = None):
    """Undo a cordon or drain, and clear the unhealthy marks (of the node's GPUs, or of the one GPU)."""
    return await _control(ctx, principal, node, NodeAction.UNCORDON, body)
