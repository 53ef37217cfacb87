"""`/jobs/{id}/ports/{port}/{path}` (replica 0) and `/jobs/{id}/replicas/{r}/ports/{port}/{path}`: HTTP (any
method) and WebSocket requests to a port a running job listens on, one its spec lists in `ports` (TensorBoard,
a debugger's page), through its node's executor gateway (`jobproxy.py`); `gpuyard port-forward` serves them on
a local port. Outside /v1: what answers is the job's own server, at its own paths.

Every request and every WebSocket upgrade is checked: a bearer token, or the dashboard's session (from its own
origin for anything but GET, HEAD and OPTIONS); another tenant's job is 404, a port the job does not list 404, a
job that is not running 409, each with its reason; the caller's credentials never reach the job."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request, Response
from fastapi.responses import RedirectResponse
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocket

from gpuyard.services.submit.auth import presented_token
from gpuyard.services.submit.errors import answers
from gpuyard.services.submit.jobproxy import Refusal, ReplicaRoute, caller, proxy_of, replica_route
from gpuyard.shared.auth.sessions import SAFE_METHODS
from gpuyard.shared.contracts.api.common import ErrorOut

router = APIRouter(tags=["access"])
PORTS = "/jobs/{job_id}/ports/{port}"
REPLICA_PORTS = "/jobs/{job_id}/replicas/{replica}/ports/{port}"
PROXIED_PATH = re.compile(r"/jobs/[^/]+/(?:replicas/[0-9]+/)?ports/[0-9]+/.*")
"""The paths forwarded to a job's port: their bodies stream on as they come (`app.streams_own_body`)."""
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
ANSWERS = {
    **answers(400, 401, 403, 404, 409, 413, 503),
    502: {
        "model": ErrorOut,
        "description": "Nothing of the job answers on that port (yet?), or its node cannot be reached.",
    },
    200: {"description": "The job's own answer, whatever its status and content."},
}
Port = Annotated[int, Path(ge=1, le=65535, description="A port the job's spec lists in `ports`.")]
Replica = Annotated[int, Path(ge=0, le=999_999, description="The replica (from 0).")]


async def port_route(
    conn: HTTPConnection, job_id: str, replica: int, port: int, *, changes: bool
) -> ReplicaRoute:
    ctx = conn.app.state.ctx
    route = await replica_route(ctx, caller(ctx, conn, changes=changes), job_id, replica)
    if port not in route.job.spec.ports:
        listed = ", ".join(map(str, route.job.spec.ports)) or "none"
        raise Refusal(
            404, f"job {route.job.job_id} does not list port {port} in its ports (it lists: {listed})"
        )
    return route


async def forward(request: Request, job_id: str, replica: int, port: int, path: str) -> Response:
    try:
        route = await port_route(request, job_id, replica, port, changes=request.method not in SAFE_METHODS)
    except Refusal as refusal:
        return refusal.response()
    return await proxy_of(request).http(request, route, port, path)


async def forward_ws(ws: WebSocket, job_id: str, replica: int, port: int, path: str) -> None:
    try:
        route = await port_route(ws, job_id, replica, port, changes=True)
    except Refusal as refusal:
        return await ws.send_denial_response(refusal.response())
    await proxy_of(ws).websocket(ws, route, port, path)
    return None


async def job_port(request: Request, job_id: str, port: Port, path: str) -> Response:
    """What replica 0 of the job answers on `port` at `path` (the job must be running and list the port)."""
    return await forward(request, job_id, 0, port, path)


async def replica_port(request: Request, job_id: str, replica: Replica, port: Port, path: str) -> Response:
    """What the replica answers on `port` at `path` (the job must be running and list the port)."""
    return await forward(request, job_id, replica, port, path)


for _method in METHODS:  # one operation each (its own operation id in the document)
    for _path, _endpoint in ((PORTS, job_port), (REPLICA_PORTS, replica_port)):
        router.add_api_route(
            _path + "/{path:path}",
            _endpoint,
            methods=[_method],
            responses=ANSWERS,
            response_class=Response,
            operation_id=f"{_endpoint.__name__}_{_method.lower()}",
            include_in_schema=_method != "HEAD",  # (as FastAPI documents no HEAD of a GET)
            dependencies=[
                Depends(presented_token)
            ],  # (the document names the bearer token: `caller` reads it)
        )


@router.get(PORTS, include_in_schema=False)
async def job_port_root(request: Request, job_id: str, port: Port) -> Response:
    """To `…/ports/{port}/`, where the job's pages' relative links work."""
    try:
        await port_route(request, job_id, 0, port, changes=False)
    except Refusal as refusal:
        return refusal.response()
    return RedirectResponse(
        request.url.path + "/" + (f"?{request.url.query}" if request.url.query else ""), 307
    )


@router.websocket(PORTS + "/{path:path}")
async def job_port_ws(ws: WebSocket, job_id: str, port: int, path: str) -> None:
    await forward_ws(ws, job_id, 0, port, path)


@router.websocket(REPLICA_PORTS + "/{path:path}")
async def replica_port_ws(ws: WebSocket, job_id: str, replica: int, port: int, path: str) -> None:
    await forward_ws(ws, job_id, replica, port, path)
