"""`WebSocket /v1/jobs/{id}/exec?replica=N&tty=0|1`: a command run in a running job's replica, or a terminal
there (`gpuyard exec`, `gpuyard shell`, the dashboard's job page), through its node's executor gateway
(`jobproxy.py`). The protocol: `gpuyard.shared.contracts.api.access`, docs/access.md.

The caller is checked on the upgrade (a bearer token, or the dashboard's session from its own origin): another
tenant's job, a job that is not running and a replica the job does not have are refused before the WebSocket
opens (404, 409, 404, each with its reason). Each session opened is logged with who, the replica and the command."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Annotated

import websockets
from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import JSONResponse
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.exceptions import InvalidHandshake, InvalidStatus

from gpuyard.services.submit.auth import presented_token
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.errors import answers
from gpuyard.services.submit.jobproxy import Refusal, ReplicaRoute, caller, proxy_of, replica_route
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.api.access import ExecStart, ProtocolError, error_frame, parse_start
from gpuyard.shared.contracts.api.common import ErrorOut
from gpuyard.shared.contracts.events.envelope import new_id
from gpuyard.shared.contracts.events.jobs import JobExecStarted
from gpuyard.shared.contracts.jobstate import JobState, JobView
from gpuyard.shared.runtime.forwarding import OPEN_SECONDS, join

log = logging.getLogger(__name__)
router = APIRouter(tags=["access"])
EXEC_PATH = "/v1/jobs/{job_id}/exec"
PROTOCOL_ERROR = 1008


def exec_query(ws: WebSocket) -> tuple[int, bool]:
    """`replica` (default 0) and `tty` (0 or 1, default 0) of the upgrade's query; Refusal (400) otherwise."""
    replica, tty = ws.query_params.get("replica", "0"), ws.query_params.get("tty", "0")
    if not replica.isdigit() or len(replica) > 6:
        raise Refusal(400, "replica is a replica's number, from 0")
    if tty not in ("0", "1"):
        raise Refusal(400, "tty is 0 (a command with pipes) or 1 (a terminal)")
    return int(replica), tty == "1"


async def say(ws: WebSocket, message: str) -> None:
    with contextlib.suppress(Exception):
        await ws.send_text(error_frame(message))
        await ws.close(PROTOCOL_ERROR)


async def exec_started(
    ctx: SubmitContext, route: ReplicaRoute, principal: Principal, start: ExecStart, tty: bool
) -> bool:
    """The audit of an exec session opened, before anything runs: `job.exec_started` in the job's events (who,
    which replica, what) and a line of the service's log. False when the job is no longer running."""
    log.info(
        "exec: %s (tenant %s) into job %s replica %d on node %s: %s",
        principal.name,
        principal.tenant,
        route.job.job_id,
        route.replica,
        route.node,
        start.words,
    )
    audit = JobExecStarted(
        job_id=route.job.job_id,
        attempt=route.job.attempt,
        replica=route.replica,
        node=route.node,
        by=principal.name,
        command=start.argv,
        tty=tty,
    )

    def decide(view: JobView | None) -> JobExecStarted | None:
        running = view is not None and view.state is JobState.RUNNING and view.attempt == audit.attempt
        return audit if running else None

    outcome = await ctx.ledger.record(audit.job_id, decide, event_id=lambda _view: new_id())
    return outcome.event is not None and outcome.refused is None


UPGRADE = (
    "exec is a WebSocket: send this request with 'Connection: Upgrade' and 'Upgrade: websocket' "
    "(gpuyard exec and gpuyard shell do; the protocol: docs/access.md)"
)
ANSWERS = {
    **answers(400, 401, 403, 404, 409, 413, 503),
    426: {
        "model": ErrorOut,
        "description": "The job can be reached: this route is a WebSocket (docs/access.md).",
    },
}


@router.get(
    EXEC_PATH,
    responses=ANSWERS,
    status_code=426,
    response_model=ErrorOut,
    dependencies=[Depends(presented_token)],  # (the document names the bearer token: `caller` reads it)
)
async def exec_without_upgrade(
    request: Request,
    job_id: str,
    replica: Annotated[int, Query(ge=0, le=999_999, description="The replica (from 0).")] = 0,
    tty: Annotated[int, Query(ge=0, le=1, description="1: a terminal (a pty); 0: pipes.")] = 0,
) -> JSONResponse:
    """A command in a running job's replica, or a terminal there: a WebSocket at this address (the caller and
    the job are checked on the upgrade as here; the frames: docs/access.md). Without the upgrade: 426 for a job
    that can be reached, else why it cannot be (404, 409)."""
    ctx = request.app.state.ctx
    try:
        await replica_route(ctx, caller(ctx, request, changes=False), job_id, replica)
    except Refusal as refusal:
        return refusal.response()
    return JSONResponse({"detail": UPGRADE}, status_code=426, headers={"Upgrade": "websocket"})


@router.websocket(EXEC_PATH)
async def exec_job(ws: WebSocket, job_id: str) -> None:
    ctx = ws.app.state.ctx
    try:
        principal = caller(ctx, ws, changes=True)
        replica, tty = exec_query(ws)
        route = await replica_route(ctx, principal, job_id, replica)
    except Refusal as refusal:
        return await ws.send_denial_response(refusal.response())
    await ws.accept()
    try:
        start = parse_start(await ws.receive_text(), tty=tty)
    except ProtocolError as exc:
        return await say(ws, str(exc))
    except (WebSocketDisconnect, KeyError, RuntimeError):
        return None
    if not await exec_started(ctx, route, principal, start, tty):
        return await say(ws, f"job {job_id} is no longer running")
    proxy = proxy_of(ws)
    try:
        upstream = await websockets.connect(
            route.exec_url(tty),
            additional_headers=proxy.token.header(),
            open_timeout=OPEN_SECONDS,
            max_size=None,
            compression=None,
            proxy=None,
        )
    except InvalidStatus as exc:
        return await say(ws, gateway_refusal(exc))
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        return await say(ws, f"node {route.node}'s executor gateway cannot be reached: {type(exc).__name__}")
    async with upstream:
        await upstream.send(start.to_json())
        await join(ws, upstream)
    return None


def gateway_refusal(exc: InvalidStatus) -> str:
    try:
        return str(json.loads(exc.response.body or b"{}")["detail"])
    except (ValueError, KeyError, TypeError):
        return f"the executor gateway refused the session ({exc.response.status_code})"
