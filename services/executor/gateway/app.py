"""The gateway's routes (an ASGI app, Starlette), each behind the gateway token:

- `GET /healthz`: whether it answers (no token needed);
- `WebSocket /v1/exec/{job_id}/{attempt}/{replica}?tty=0|1`: a command run in the replica (`session.py`);
- `/v1/ports/{job_id}/{attempt}/{replica}/{port}/{path}`: HTTP (any method) and WebSocket requests forwarded to
  the replica's `port` (`gpuyard.shared.runtime.forwarding`).

The submit service names the attempt it holds running (its job view's); a replica that is not running here is 404,
one that has ended 409, each with the reason."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket

from gpuyard.services.executor.gateway.access import ReplicaAccess
from gpuyard.services.executor.gateway.replicas import NoReplica, ReplicaKey
from gpuyard.services.executor.gateway.session import run_session
from gpuyard.shared.auth.gatewaytoken import REFUSED, GatewayToken
from gpuyard.shared.runtime.forwarding import Upstream, forward_http, forward_websocket, passed_headers

PORT_PATH = "/v1/ports/{job_id}/{attempt:int}/{replica:int}/{port:int}/{path:path}"
EXEC_PATH = "/v1/exec/{job_id}/{attempt:int}/{replica:int}"
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def refused(status: int, detail: str) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status)


def key_of(params: dict) -> ReplicaKey:
    return ReplicaKey(str(params["job_id"]), int(params["attempt"]), int(params["replica"]))


def port_of(params: dict) -> int:
    port = int(params["port"])
    if not 0 < port < 65536:
        raise NoReplica(404, f"no port {port}")
    return port


def upstream_url(base: str, path: str, query: str, *, websocket: bool = False) -> str:
    url = f"{base}/{path}" + (f"?{query}" if query else "")
    return "ws" + url.removeprefix("http") if websocket else url


def gateway_app(token: GatewayToken, access: ReplicaAccess) -> Starlette:
    client = Upstream()

    async def healthz(_: Request) -> Response:
        return JSONResponse({"status": "ok", "service": "executor-gateway"})

    async def exec_ws(ws: WebSocket) -> None:
        if not token.allows(ws.headers.get("authorization")):
            return await ws.send_denial_response(refused(401, REFUSED))
        key, tty = key_of(ws.path_params), ws.query_params.get("tty", "0") == "1"
        await ws.accept()
        await run_session(ws, lambda start: access.open_exec(key, start, tty=tty), tty=tty)
        return None

    async def port_http(request: Request) -> Response:
        if not token.allows(request.headers.get("authorization")):
            return refused(401, REFUSED)
        try:
            base = await access.port_url(key_of(request.path_params), port_of(request.path_params))
        except NoReplica as exc:
            return refused(exc.status, exc.message)
        url = upstream_url(base, request.path_params["path"], request.url.query)
        return await forward_http(
            request, client, url, passed_headers(request.headers.raw, ["authorization"])
        )

    async def port_ws(ws: WebSocket) -> None:
        if not token.allows(ws.headers.get("authorization")):
            return await ws.send_denial_response(refused(401, REFUSED))
        try:
            base = await access.port_url(key_of(ws.path_params), port_of(ws.path_params))
        except NoReplica as exc:
            return await ws.send_denial_response(refused(exc.status, exc.message))
        url = upstream_url(base, ws.path_params["path"], ws.url.query, websocket=True)
        await forward_websocket(ws, url, passed_headers(ws.headers.raw, ["authorization"]))
        return None

    app = Starlette(
        routes=[
            Route("/healthz", healthz),
            WebSocketRoute(EXEC_PATH, exec_ws),
            Route(PORT_PATH, port_http, methods=METHODS),
            WebSocketRoute(PORT_PATH, port_ws),
        ],
    )
    return app
