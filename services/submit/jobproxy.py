"""The way from the submit service into a running job (docs/access.md): which node's executor gateway holds a
job's replica (`replica_route`, from the job's view and the nodes' heartbeats), who asks (`caller`: a bearer
token or the dashboard's session, on HTTP and on a WebSocket's upgrade alike), and the reusable proxy
(`JobProxy`) that forwards an HTTP request or a WebSocket to a replica's port, or opens an exec session, with
the gateway token, adding what the next hop needs (a header, a query parameter: a notebook server's token).

The caller's credentials never travel on: its `Authorization` header and the session cookie are taken out; nor
does a job's answer set the session cookie."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from fastapi import HTTPException
from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket

from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.jobs import visible_job
from gpuyard.shared.auth import sessions
from gpuyard.shared.auth.bearer import bearer_token
from gpuyard.shared.auth.gatewaytoken import GatewayToken
from gpuyard.shared.auth.jobtokens import is_job_token
from gpuyard.shared.auth.tokens import Principal, TokenRefused
from gpuyard.shared.contracts.jobstate import JobState, JobView
from gpuyard.shared.runtime.forwarding import (
    Upstream,
    forward_http,
    forward_websocket,
    passed_headers,
    without_cookie,
)
from gpuyard.shared.settings.gateway import GatewaySettings

log = logging.getLogger(__name__)
MISSING = "missing bearer token: send 'Authorization: Bearer <token>' (or log in to the dashboard)"


class Refusal(Exception):
    """A request refused before it reaches a job: its status and reason."""

    def __init__(self, status_code: int, detail: str):
        super().__init__(detail)
        self.status_code = status_code
        self.detail = detail

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status_code == 401 else None
        return JSONResponse({"detail": self.detail}, status_code=self.status_code, headers=headers)


def refusal_of(exc: HTTPException) -> Refusal:
    return Refusal(exc.status_code, str(exc.detail))


def caller(ctx: SubmitContext, conn: HTTPConnection, *, changes: bool) -> Principal:
    """Who sends `conn`: its bearer token's principal, or its dashboard session's; a session's request that
    `changes` something (any WebSocket, any method but GET, HEAD, OPTIONS) must come from the dashboard's own
    origin. Refusal (401, 403) otherwise."""
    token = bearer_token(conn.headers.get("authorization"))
    if token is None:
        cookie = conn.cookies.get(sessions.COOKIE)
        if cookie is None or ctx.session_secret is None:
            raise Refusal(401, MISSING)
        try:
            session = sessions.read(ctx.session_secret, cookie)
            principal = ctx.tokens.authenticate_id(session.token_id)
        except (sessions.SessionRefused, TokenRefused) as exc:
            raise Refusal(401, str(exc)) from None
        if changes and not sessions.same_origin(conn.headers.get("origin"), conn.headers.get("host")):
            raise Refusal(403, "a request from another site's page")
        return principal
    if is_job_token(token):
        raise Refusal(401, "a job's token does not reach into jobs")
    try:
        return ctx.tokens.authenticate(token)
    except TokenRefused as exc:
        raise Refusal(401, str(exc)) from None


@dataclass(frozen=True)
class ReplicaRoute:
    """Where a running job's replica is reached: its node's gateway."""

    job: JobView
    replica: int
    node: str
    gateway: str

    @property
    def prefix(self) -> str:
        return f"{self.job.job_id}/{self.job.attempt}/{self.replica}"

    def exec_url(self, tty: bool) -> str:
        return ws_url(f"{self.gateway}/v1/exec/{self.prefix}?tty={int(tty)}")

    def port_url(self, port: int, path: str, query: str, *, websocket: bool = False) -> str:
        url = f"{self.gateway}/v1/ports/{self.prefix}/{port}/{path}" + (f"?{query}" if query else "")
        return ws_url(url) if websocket else url


def ws_url(url: str) -> str:
    return "ws" + url.removeprefix("http")


async def replica_route(ctx: SubmitContext, principal: Principal, job_id: str, replica: int) -> ReplicaRoute:
    """The route to a replica of a job the caller may see: 404 for a job it may not see (or none) and a replica
    the job does not have, 409 for a job that is not running, 503 for a node without a gateway."""
    try:
        view = await visible_job(ctx, principal, job_id)
    except HTTPException as exc:
        raise refusal_of(exc) from None
    return running_route(ctx, view, replica)


def running_route(ctx: SubmitContext, view: JobView, replica: int) -> ReplicaRoute:
    """The route to a replica of the job `view` (one the caller may see): 409, 404 and 503 as `replica_route`."""
    if view.state != JobState.RUNNING:
        raise Refusal(409, f"job {view.job_id} is {view.state.value}: only a running job can be reached")
    placement = next((p for p in view.placements if p.replica == replica), None)
    if placement is None:
        last = max((p.replica for p in view.placements), default=0)
        raise Refusal(404, f"job {view.job_id} has no replica {replica} (its replicas: 0 to {last})")
    heard = ctx.telemetry.nodes.get(placement.node)
    gateway = heard[1].gateway if heard is not None else ""
    if not gateway:
        raise Refusal(503, f"node {placement.node} announces no executor gateway: its jobs cannot be reached")
    return ReplicaRoute(view, replica, placement.node, gateway.rstrip("/"))


class JobProxy:
    """Forwards requests into running jobs through their nodes' gateways (one per submit service)."""

    def __init__(self, token: GatewayToken):
        self.token = token
        self.client = Upstream()

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> JobProxy:
        return cls(GatewayToken(settings.gateway_token_path))

    def headers(
        self, conn: HTTPConnection, add: dict[str, str] | None = None, drop: list[str] | None = None
    ) -> list[tuple[str, str]]:
        """The caller's headers without its credentials (nor `drop`), with the gateway token (and `add`)."""
        kept = passed_headers(conn.headers.raw, drop=["authorization", *(drop or [])], add=add)
        return without_cookie(kept, sessions.COOKIE) + list(self.token.header().items())

    async def http(
        self,
        request: Request,
        route: ReplicaRoute,
        port: int,
        path: str,
        *,
        add_headers: dict[str, str] | None = None,
        add_query: dict[str, str] | None = None,
        drop_headers: list[str] | None = None,
    ) -> Response:
        """`request` forwarded to the replica's `port` at `path` (its query, plus `add_query`)."""
        url = route.port_url(port, path, joined_query(request.url.query, add_query))
        headers = self.headers(request, add_headers, drop_headers)
        response = await forward_http(request, self.client, url, headers)
        response.raw_headers = [h for h in response.raw_headers if not sets_session_cookie(*h)]
        return response

    async def websocket(
        self,
        ws: WebSocket,
        route: ReplicaRoute,
        port: int,
        path: str,
        *,
        add_headers: dict[str, str] | None = None,
        add_query: dict[str, str] | None = None,
        drop_headers: list[str] | None = None,
        on_client_message: Callable[[], None] | None = None,
    ) -> None:
        """The WebSocket `ws` (not accepted yet) joined to one on the replica's `port` at `path`;
        `on_client_message()` for each message the caller sends."""
        url = route.port_url(port, path, joined_query(ws.url.query, add_query), websocket=True)
        headers = self.headers(ws, add_headers, drop_headers)
        await forward_websocket(ws, url, headers, on_client_message=on_client_message)


def sets_session_cookie(name: bytes, value: bytes) -> bool:
    """A job's answer that would set (or clear) the dashboard's session cookie: never passed on."""
    return name.lower() == b"set-cookie" and value.split(b"=", 1)[0].strip() == sessions.COOKIE.encode()


def joined_query(query: str, add: dict[str, str] | None) -> str:
    if not add:
        return query
    extra = urlencode(add)
    return f"{query}&{extra}" if query else extra


def proxy_of(conn: HTTPConnection) -> JobProxy:
    """The app's proxy: `app.state.job_proxy` when the service set one, else one from the environment's gateway
    settings (GPUYARD_GATEWAY_TOKEN_FILE; `gpuyard up` sets it), made once."""
    state = conn.app.state
    proxy = getattr(state, "job_proxy", None)
    if proxy is None:
        proxy = state.job_proxy = JobProxy.from_settings(GatewaySettings())
    return proxy
