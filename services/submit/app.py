"""The submit service's HTTP API (FastAPI). Bad input gets a 4xx with a reason; never a 500."""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from services.submit import (
    routes_admin,
    routes_alerts,
    routes_jobs,
    routes_models,
    routes_nodes,
    routes_platform,
    routes_tenants,
    routes_usage,
    routes_why,
)
from services.submit.body import BodyTooLarge, read_body, replaying
from services.submit.context import SubmitContext
from services.submit.dashboard import add_dashboard
from services.submit.docs_pages import add_docs_pages
from services.submit.errors import answers, too_many
from services.submit.fastpath import FastSubmit
from services.submit.queuedepth import QueueFull
from shared.api import HealthOut
from shared.bus import BusUnavailable
from shared.servicemetrics import CONTENT_TYPE, METRICS_PATH, render
from shared.store import ConcurrencyError, StoreUnavailable
from shared.version import VERSION

log = logging.getLogger(__name__)


class BodyLimit:
    """413 for a body over the limit, whether it says its length or streams in chunks (a plain ASGI
    middleware: Starlette's BaseHTTPMiddleware would cost more than the rest of a submit)."""

    def __init__(self, app, limit: int, uploads: dict[str, int] | None = None):
        """`uploads`: a larger limit for the POSTs to those paths (a model's file)."""
        self.app = app
        self.limit = limit
        self.uploads = uploads or {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        limit = self.limit
        if scope["method"] == "POST" and scope["path"] in self.uploads:
            limit = self.uploads[scope["path"]]
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None:
            if not declared.isdigit():
                return await self.refuse(scope, receive, send, 400, "invalid Content-Length")
            if int(declared) > limit:
                return await self.refuse(scope, receive, send, 413, f"request body over {limit} bytes")
            return await self.app(scope, receive, send)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        try:  # chunked: read it all first, counting
            body = await read_body(receive, limit)
        except BodyTooLarge:
            return await self.refuse(scope, receive, send, 413, f"request body over {limit} bytes")
        if body is None:
            return None
        return await self.app(scope, replaying(body, receive), send)

    @staticmethod
    async def refuse(scope, receive, send, code: int, detail: str) -> None:
        await JSONResponse({"detail": detail}, status_code=code)(scope, receive, send)


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
    app.add_middleware(  # added last: the outer one, before FastSubmit
        BodyLimit, limit=ctx.max_body_bytes, uploads={"/v1/models": ctx.max_model_bytes}
    )
    app.include_router(routes_jobs.router)
    app.include_router(routes_platform.router)
    app.include_router(routes_nodes.router)
    app.include_router(routes_models.router)
    app.include_router(routes_admin.router)
    app.include_router(routes_alerts.router)
    app.include_router(routes_usage.router)
    app.include_router(routes_why.router)
    add_dashboard(app)
    app.include_router(routes_tenants.router)

    @app.get("/healthz", tags=["health"], response_model=HealthOut, responses=answers(400, 413))
    async def healthz() -> HealthOut:
        return HealthOut(status="ok", service="submit")

    @app.get(METRICS_PATH, include_in_schema=False)
    async def metrics() -> Response:
        """The submit service's own Prometheus figures (`shared.servicemetrics`), without a token as the
        monitor's /metrics: a Prometheus scrape carries none (docs/operations.md, "Metrics of each service")."""
        body = await asyncio.to_thread(render, ctx.bus.metrics.registry) if ctx.bus is not None else b""
        return Response(body, media_type=CONTENT_TYPE)

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
