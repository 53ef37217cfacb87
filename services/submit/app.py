"""The submit service's HTTP API (FastAPI). Bad input gets a 4xx with a reason; never a 500."""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Receive, Scope, Send

from gpuyard.services.submit import (
    routes_admin,
    routes_alerts,
    routes_artifacts,
    routes_checkpoints,
    routes_dev,
    routes_environments,
    routes_exec,
    routes_jobs,
    routes_models,
    routes_nodes,
    routes_platform,
    routes_ports,
    routes_tenants,
    routes_usage,
    routes_volumes,
    routes_why,
)
from gpuyard.services.submit.auth import CHALLENGE, PUBLISH_PATH, refusal_before_body
from gpuyard.services.submit.body import BodyTooLarge, read_body, replaying
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.dashboard import add_dashboard
from gpuyard.services.submit.docs_pages import add_docs_pages
from gpuyard.services.submit.errors import answers, too_many
from gpuyard.services.submit.fastpath import FastSubmit
from gpuyard.services.submit.fastproxy import FastProxy
from gpuyard.services.submit.queuedepth import QueueFull
from gpuyard.shared.bus.jetstream import BusUnavailable
from gpuyard.shared.contracts.api.common import HealthOut
from gpuyard.shared.contracts.version import VERSION
from gpuyard.shared.runtime.servicemetrics import CONTENT_TYPE, METRICS_PATH, render
from gpuyard.shared.stores.events import ConcurrencyError, StoreUnavailable

log = logging.getLogger(__name__)


class BodyLimit:
    """What is decided of a request before its body is read (a plain ASGI middleware: Starlette's
    BaseHTTPMiddleware would cost more than the rest of a submit):

    - a body for the API (/v1) from a caller that carries no credential, or a token refused, is answered 401 at
      once (`auth.refusal_before_body`): no body is read for a caller that may not send one;
    - an invalid Content-Length is 400; a body over the limit 413, whether it says its length or streams in
      chunks (those are read here, counting, and handed on: a small body);
    - `uploads`: the routes that read their own body as it streams, after authenticating the caller, and
      apply their own limit (a model's file, `routes_models.publish_model`): passed on unread."""

    def __init__(
        self,
        app: ASGIApp,
        ctx: SubmitContext,
        limit: int,
        uploads: Callable[[str, str], bool] = lambda m, p: False,
    ):
        self.app = app
        self.ctx = ctx
        self.limit = limit
        self.uploads = uploads

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[bytes, bytes] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name, value)  # the first of a repeated header, as Starlette reads it
        declared = headers.get(b"content-length")
        if declared is not None and not declared.isdigit():
            return await self.refuse(scope, receive, send, 400, "invalid Content-Length")
        has_body = (declared is not None and int(declared) > 0) or b"transfer-encoding" in headers
        method, path = scope["method"], scope["path"]
        if has_body and path.startswith("/v1/"):
            why = refusal_before_body(self.ctx, method, path, headers)
            if why is not None:
                return await self.refuse(scope, receive, send, 401, why, CHALLENGE)
        if self.uploads(method, path):
            return await self.app(scope, receive, send)
        if declared is not None:
            if int(declared) > self.limit:
                return await self.refuse(scope, receive, send, 413, f"request body over {self.limit} bytes")
            return await self.app(scope, receive, send)
        if method not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        try:  # chunked: read it all first (at most `limit` bytes), counting
            body = await read_body(receive, self.limit)
        except BodyTooLarge:
            return await self.refuse(scope, receive, send, 413, f"request body over {self.limit} bytes")
        if body is None:
            return None
        return await self.app(scope, replaying(body, receive), send)

    @staticmethod
    async def refuse(
        scope: Scope,
        receive: Receive,
        send: Send,
        code: int,
        detail: str,
        headers: dict[str, str] | None = None,
    ) -> None:
        await JSONResponse({"detail": detail}, status_code=code, headers=headers)(scope, receive, send)


HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


class AllowedMethods:
    """Every method the API takes at a path, from its OpenAPI document: a path that several routes share
    (`GET` and `POST /v1/jobs`) allows them all, where Starlette's 405 names the first route's alone. Of the
    paths of the document a request's matches, the one with the fewest parameters is its resource
    (`/v1/jobs/validate`, not `/v1/jobs/{job_id}`)."""

    def __init__(self, app: FastAPI):
        self.app = app
        self.paths: list[tuple[re.Pattern, int, frozenset[str]]] | None = None

    def __call__(self, path: str, own: str | None) -> str:
        """The `Allow` of a 405 at `path`; `own`: Starlette's, for a route the document leaves out."""
        if self.paths is None:  # (once: the document is the routes')
            self.paths = [
                (
                    compile_path(template)[0],
                    template.count("{"),
                    frozenset(m.upper() for m in ops if m in HTTP_METHODS),
                )
                for template, ops in self.app.openapi().get("paths", {}).items()
            ]
        matching = [(params, documented) for pattern, params, documented in self.paths if pattern.match(path)]
        if not matching:
            return own or ""
        fewest = min(params for params, _ in matching)
        methods = set().union(*(documented for params, documented in matching if params == fewest))
        if "GET" in methods:
            methods.add("HEAD")  # (Starlette answers HEAD wherever GET)
        return ", ".join(sorted(methods))


def carried(value: Any) -> Any:
    """`value` as JSON can carry it: a number that is not finite as its text ('nan', 'inf'), a lone surrogate
    escaped ('\\ud800'). A 422 echoes the input it refuses; such an input would otherwise fail to encode and
    turn the 422 into a 500 (and the server would drop the connection)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {carried(k): carried(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [carried(v) for v in value]
    return value


def streams_own_body(method: str, path: str) -> bool:
    """The routes that read their own body as it streams, each with its own limit: a model's file, a volume's
    upload; and a request to a job's port, streamed on to the job's server, which decides."""
    if routes_ports.PROXIED_PATH.fullmatch(path) is not None:
        return True
    if routes_dev.PROXIED_PATH.fullmatch(path) is not None:
        return True
    if method == "POST":
        return path == PUBLISH_PATH
    return method == "PUT" and routes_volumes.CONTENT_PATH.fullmatch(path) is not None


def metrics_shown(ctx: SubmitContext, authorization: str | None) -> list[CollectorRegistry]:
    """What /metrics shows: the submit service's own Prometheus figures (`gpuyard.shared.runtime.servicemetrics`)
    to any scrape, and the volumes' size and use (`volumemetrics.py`, which name tenants) to one that `ctx.scrape`
    allows (docs/operations.md, "Metrics of each service")."""
    registries = [ctx.bus.metrics.registry] if ctx.bus is not None else []
    volumes, scrape = ctx.volume_metrics, ctx.scrape
    if volumes is not None and scrape is not None and scrape.allows(authorization):
        registries.append(volumes.registry)
    return registries


def create_app(ctx: SubmitContext) -> FastAPI:
    app = FastAPI(
        title="GPUYARD",
        version=VERSION,
        description="Submit, follow and cancel GPU training jobs; publish models. Every request carries "
        "`Authorization: Bearer`.",
        docs_url=None,
        redoc_url=None,
    )
    add_docs_pages(app)
    app.state.ctx = ctx
    app.add_middleware(FastSubmit, ctx=ctx)
    app.add_middleware(FastProxy)
    app.add_middleware(  # added last: the outer one, before FastProxy and FastSubmit
        BodyLimit, ctx=ctx, limit=ctx.max_body_bytes, uploads=streams_own_body
    )
    app.include_router(routes_jobs.router)
    app.include_router(routes_checkpoints.router)
    app.include_router(routes_artifacts.router)
    app.include_router(routes_platform.router)
    app.include_router(routes_nodes.router)
    app.include_router(routes_models.router)
    app.include_router(routes_volumes.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_alerts.router)
    app.include_router(routes_usage.router)
    app.include_router(routes_why.router)
    app.include_router(routes_exec.router)
    app.include_router(routes_ports.router)
    app.include_router(routes_environments.router)
    app.include_router(routes_dev.router)
    add_dashboard(app)
    app.include_router(routes_tenants.router)

    @app.get("/healthz", tags=["health"], response_model=HealthOut, responses=answers(400, 413))
    async def healthz() -> HealthOut:
        return HealthOut(status="ok", service="submit")

    @app.get(METRICS_PATH, include_in_schema=False)
    async def metrics(request: Request) -> Response:
        registries = metrics_shown(ctx, request.headers.get("authorization"))
        body = await asyncio.to_thread(render, *registries) if registries else b""
        return Response(body, media_type=CONTENT_TYPE)

    allowed = AllowedMethods(app)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        """FastAPI's own answer, with a 405's `Allow` naming every method of the path (RFC 9110)."""
        if exc.status_code == 405:
            own = (exc.headers or {}).get("Allow")
            exc.headers = {**(exc.headers or {}), "Allow": allowed(request.url.path, own)}
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        """FastAPI's own answer (each refused field with its reason), in JSON whatever the input was."""
        return JSONResponse({"detail": carried(jsonable_encoder(exc.errors()))}, status_code=422)

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(BusUnavailable)
    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        log.error("dependency unavailable: %s", exc)
        return JSONResponse(
            {"detail": f"temporarily unavailable: {exc}"}, status_code=503, headers={"Retry-After": "2"}
        )

    @app.exception_handler(QueueFull)
    async def queue_full(_: Request, exc: QueueFull) -> JSONResponse:
        return too_many(exc)

    @app.exception_handler(ConcurrencyError)
    async def busy(_: Request, exc: ConcurrencyError) -> JSONResponse:
        return JSONResponse(
            {"detail": "the job or model is changing right now; try again"},
            status_code=503,
            headers={"Retry-After": "1"},
        )

    return app
