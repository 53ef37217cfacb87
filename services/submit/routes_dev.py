"""Dev environments (docs/dev.md): `POST /v1/dev` starts one (a job with a `dev` block: queued, placed and
counted as every job), `GET /v1/dev` lists the caller's tenant's, `DELETE /v1/dev/{id}` stops one; and
`/dev/{id}/…` is its JupyterLab, HTTP (any method) and WebSocket (kernels, terminals), forwarded through its
node's executor gateway (`jobproxy.py`) to the notebook server on the node's loopback.

Every request to `/dev/{id}/…` and every WebSocket upgrade is checked as on `/jobs/{id}/ports/…`: a bearer
token, or the dashboard's session (from its own origin for a WebSocket and anything but GET, HEAD, OPTIONS);
another tenant's environment is 403, one that is not running 409. The proxy adds the notebook server's token
(derived from the platform's job-token secret: `gpuyard.shared.auth.devtoken`; the caller never sees it) and
takes out the caller's credentials and its `Origin`: the notebook server's own origin check would compare it with
the loopback address it listens on, and the platform has made that check itself, against its own address,
before anything is forwarded.

What the user does there (a message on a kernel's or terminal's WebSocket, a request that changes something) is
noted as the environment's activity (`devactivity.py`), which keeps it from being stopped as idle."""

from __future__ import annotations

import logging
import re
from pathlib import Path as FilePath
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Depends, HTTPException, Path, Request, Response, status
from fastapi.responses import HTMLResponse, RedirectResponse
from starlette.requests import HTTPConnection
from starlette.websockets import WebSocket

from gpuyard.services.submit.auth import Context, CurrentPrincipal, may_see, presented_token
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.devactivity import counts_request, counts_socket, notes_of
from gpuyard.services.submit.devhome import home_volume
from gpuyard.services.submit.errors import REFUSED_422, answers
from gpuyard.services.submit.jobproxy import Refusal, ReplicaRoute, caller, proxy_of, running_route
from gpuyard.services.submit.jobs import cancel, queue_job, visible_job
from gpuyard.shared.auth.devtoken import dev_port, dev_token
from gpuyard.shared.auth.jobtokens import JobTokenError, read_secret
from gpuyard.shared.auth.sessions import SAFE_METHODS
from gpuyard.shared.contracts.api.dev import DEFAULT_IDLE_TIMEOUT, DevIn, DevListOut, DevOut
from gpuyard.shared.contracts.api.jobs import CancelOut
from gpuyard.shared.contracts.devspec import DEV_PATH, DevSpec, dev_url
from gpuyard.shared.contracts.jobspec import JobSpec, Resources, VolumeMount
from gpuyard.shared.contracts.jobstate import LIVE_STATES, JobState, JobView, state_values

log = logging.getLogger(__name__)
router = APIRouter(tags=["dev"], responses=answers(400, 401, 413))
PROXIED_PATH = re.compile(rf"{DEV_PATH}/[^/]+/.*")
"""The paths forwarded to a dev environment: their bodies stream on as they come (`app.streams_own_body`)."""
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
LIVE = state_values(LIVE_STATES)
LISTED_MOST = 200
DROPPED = ["origin"]
JobId = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")]


# ---------------------------------------------------------------- the API


def dev_out(view: JobView) -> DevOut:
    mount = next((v.name for v in view.spec.volumes), None)
    message = view.pending.message if view.pending is not None else view.message
    # a failed start's own line (JupyterLab missing, and how to install it), from its log's last lines
    said = next((line for line in reversed(view.log_tail) if line.startswith("gpuyard dev:")), None)
    if view.state == JobState.FAILED and said:
        message = f"{message}: {said.removeprefix('gpuyard dev: ')}"
    return DevOut(
        job_id=view.job_id, name=view.name, tenant=view.tenant, user=view.user, state=view.state,
        url=dev_url(view.job_id), gpus=view.spec.resources.gpus, idle_timeout=view.spec.idle_timeout or None,
        notebooks=mount, submitted_at=view.created_at, message=message,
    )  # fmt: skip


def dev_spec(body: DevIn, home: str | None) -> JobSpec:
    dev = DevSpec()
    timeout = DEFAULT_IDLE_TIMEOUT if body.idle_timeout is None else body.idle_timeout
    return JobSpec(
        name=body.name,
        dev=dev,
        resources=Resources(gpus=body.gpus),
        environment=body.environment,
        idle_timeout=timeout,
        priority=body.priority,
        volumes=[VolumeMount(name=home, path=dev.root)] if home else [],
    )


async def dev_job(ctx: SubmitContext, principal, job_id: str) -> JobView:
    view = await visible_job(ctx, principal, job_id)
    if view.spec.dev is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {view.job_id} is not a dev environment")
    return view


@router.post(
    "/v1/dev",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DevOut,
    responses=answers(400, 401, 403, 404, 409, 413, 429, 503) | REFUSED_422,
)
async def start_dev(body: DevIn, ctx: Context, principal: CurrentPrincipal) -> DevOut:
    """Start a dev environment: JupyterLab as a job of kind `dev`, queued and placed as any job, its notebooks
    in the caller's own volume (`dev-<user>`, made at the first start). Answers at once; it is reached at `url`
    once running."""
    home = await home_volume(ctx, principal, principal.tenant)
    try:
        spec = dev_spec(body, home)
    except ValueError as exc:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from None
    accepted = await queue_job(ctx, principal, spec, None)
    log.info(
        "dev environment %s started by %s of tenant %s", accepted.job_id, principal.name, accepted.tenant
    )
    return dev_out(await visible_job(ctx, principal, accepted.job_id))


@router.get("/v1/dev", response_model=DevListOut, responses=answers(401))
async def list_dev(ctx: Context, principal: CurrentPrincipal) -> DevListOut:
    """The dev environments of the caller's tenant that are queued, placed or running (an admin: every
    tenant's), newest first."""
    tenant = None if principal.admin else principal.tenant
    page = await ctx.store.list_projections(states=LIVE, tenant=tenant, limit=LISTED_MOST)
    views = [JobView.model_validate(d) for d in page.items]
    return DevListOut(items=[dev_out(v) for v in views if v.spec.dev is not None])


@router.get("/v1/dev/{job_id}", response_model=DevOut, responses=answers(401, 404, 409))
async def get_dev(job_id: JobId, ctx: Context, principal: CurrentPrincipal) -> DevOut:
    """One dev environment (its id or a unique prefix of it)."""
    return dev_out(await dev_job(ctx, principal, job_id))


@router.delete("/v1/dev/{job_id}", response_model=CancelOut, responses=answers(401, 404, 409))
async def stop_dev(job_id: JobId, ctx: Context, principal: CurrentPrincipal) -> CancelOut:
    """Stop a dev environment (a cancel of its job): its GPUs go back, its notebooks stay in its volume."""
    view = await dev_job(ctx, principal, job_id)
    return await cancel(ctx, principal, view.job_id)


# ---------------------------------------------------------------- the proxy


_keys: dict[FilePath, tuple[tuple[int, int], bytes]] = {}


def notebook_key(ctx: SubmitContext) -> bytes:
    """The secret the notebook servers' ports and tokens are derived with (the job tokens' secret), read again
    when its file changes; 503 without one."""
    path = ctx.publish_secret_file
    if path is None:
        raise Refusal(503, "this platform has no job-token secret: dev environments cannot be reached")
    try:
        found = path.stat()
        seen = (found.st_mtime_ns, found.st_ino)
        known = _keys.get(path)
        if known is None or known[0] != seen:
            known = _keys[path] = (seen, read_secret(path))
    except (OSError, JobTokenError) as exc:
        raise Refusal(503, f"dev environments cannot be reached: {exc}") from None
    return known[1]


async def dev_route(conn: HTTPConnection, job_id: str, *, changes: bool) -> tuple[ReplicaRoute, int, str]:
    """The route to a running dev environment the caller's tenant owns, its notebook server's port and token:
    401 without credentials, 404 for none, 403 for another tenant's, 409 for one not running."""
    ctx: SubmitContext = conn.app.state.ctx
    principal = caller(ctx, conn, changes=changes)
    doc = await ctx.store.get_projection(job_id)
    dev = doc is not None and doc.get("spec", {}).get("dev") is not None
    if doc is None or not (dev or may_see(principal, doc["tenant"])):
        raise Refusal(404, f"no job {job_id!r}")
    if not may_see(principal, doc["tenant"]):
        raise Refusal(403, f"dev environment {job_id} belongs to another tenant")
    if not dev:
        raise Refusal(404, f"job {job_id} is not a dev environment")
    route = running_route(ctx, JobView.model_validate(doc), 0)
    secret = notebook_key(ctx)
    attempt = route.job.attempt
    return route, dev_port(secret, job_id, attempt), dev_token(secret, job_id, attempt)


def upstream_path(job_id: str, path: str) -> str:
    return f"{DEV_PATH.lstrip('/')}/{job_id}/{path}"


def refused(request: Request, refusal: Refusal) -> Response:
    """The refusal; a browser's page without credentials goes to the dashboard's login, which brings it back."""
    if (
        refusal.status_code == 401
        and request.method == "GET"
        and "text/html" in request.headers.get("accept", "")
    ):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse(f"/?next={quote(target)}", status_code=303)
    return refusal.response()


async def forward(request: Request, job_id: str, path: str) -> Response:
    try:
        route, port, token = await dev_route(request, job_id, changes=request.method not in SAFE_METHODS)
    except Refusal as refusal:
        return refused(request, refusal)
    if counts_request(request.method):
        notes_of(request).note(route.job)
    answer = await proxy_of(request).http(
        request, route, port, upstream_path(job_id, path), add_query={"token": token}, drop_headers=DROPPED
    )
    if wants_page(request) and not_listening(answer):
        return starting_page(job_id)
    return answer


def wants_page(request: Request) -> bool:
    return request.method == "GET" and "text/html" in request.headers.get("accept", "")


def not_listening(answer: Response) -> bool:
    """The gateway's answer that nothing of the replica listens on the port yet (JupyterLab starting)."""
    body = getattr(answer, "body", b"")
    return answer.status_code in (404, 502) and b"listens on port" in body or answer.status_code == 502


def starting_page(job_id: str) -> Response:
    """A browser's page while the environment's JupyterLab starts: it asks again each second."""
    html = (
        "<!doctype html><html><head><meta charset=utf-8><meta http-equiv=refresh content=1>"
        f"<title>Starting {job_id}</title></head><body><p>JupyterLab of dev environment {job_id} is starting: "
        "this page opens it as soon as it answers.</p></body></html>"
    )
    return HTMLResponse(html, status_code=503, headers={"Retry-After": "1", "Cache-Control": "no-store"})


async def dev_page(request: Request, job_id: JobId, path: str) -> Response:
    """What the dev environment's JupyterLab answers at `path` (it must be running and be the caller's
    tenant's)."""
    return await forward(request, job_id, path)


for _method in METHODS:  # one operation each (its own operation id in the document)
    router.add_api_route(
        DEV_PATH + "/{job_id}/{path:path}",
        dev_page,
        methods=[_method],
        responses={**answers(401, 403, 404, 409, 503), 200: {"description": "JupyterLab's own answer."}},
        response_class=Response,
        operation_id=f"dev_page_{_method.lower()}",
        include_in_schema=_method != "HEAD",
        dependencies=[Depends(presented_token)],
    )


@router.get(DEV_PATH + "/{job_id}", include_in_schema=False)
async def dev_root(request: Request, job_id: JobId) -> Response:
    """To `/dev/{id}/lab`, JupyterLab's page."""
    try:
        await dev_route(request, job_id, changes=False)
    except Refusal as refusal:
        return refused(request, refusal)
    return RedirectResponse(dev_url(job_id), 307)


@router.websocket(DEV_PATH + "/{job_id}/{path:path}")
async def dev_ws(ws: WebSocket, job_id: str, path: str) -> None:
    try:
        route, port, token = await dev_route(ws, job_id, changes=True)
    except Refusal as refusal:
        return await ws.send_denial_response(refusal.response())
    active = notes_of(ws).noter(route.job) if counts_socket(path) else None
    await proxy_of(ws).websocket(
        ws,
        route,
        port,
        upstream_path(job_id, path),
        add_query={"token": token},
        drop_headers=DROPPED,
        on_client_message=active,
    )
    return None
