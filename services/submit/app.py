"""The submit service's HTTP API (FastAPI). Bad input gets a 4xx with a reason; never a 500."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from starlette.middleware.base import BaseHTTPMiddleware

from services.submit import routes_jobs, routes_platform
from services.submit.context import SubmitContext
from shared.bus import BusUnavailable
from shared.store import ConcurrencyError, StoreUnavailable

log = logging.getLogger(__name__)


class BodyLimit(BaseHTTPMiddleware):
    """413 for a body over the limit, whether it says its length or streams in chunks."""

    def __init__(self, app, limit: int):
        super().__init__(app)
        self.limit = limit

    async def dispatch(self, request: Request, call_next):
        declared = request.headers.get("content-length")
        too_large = JSONResponse(
            {"detail": f"request body over {self.limit} bytes"}, status_code=status.HTTP_413_CONTENT_TOO_LARGE
        )
        if declared is not None:
            if not declared.isdigit():
                return JSONResponse({"detail": "invalid Content-Length"}, status_code=400)
            if int(declared) > self.limit:
                return too_large
        elif request.method in ("POST", "PUT", "PATCH"):
            size = 0
            async for chunk in request.stream():
                size += len(chunk)
                if size > self.limit:
                    return too_large
        return await call_next(request)


def create_app(ctx: SubmitContext) -> FastAPI:
    app = FastAPI(
        title="GPUYARD",
        version="0.1.0",
        description="Submit, follow and cancel GPU training jobs. Every request carries `Authorization: Bearer`.",
    )
    app.state.ctx = ctx
    app.add_middleware(BodyLimit, limit=ctx.max_body_bytes)
    app.include_router(routes_jobs.router)
    app.include_router(routes_platform.router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> dict:
        return {"status": "ok", "service": "submit"}

    @app.exception_handler(StoreUnavailable)
    @app.exception_handler(BusUnavailable)
    async def unavailable(_: Request, exc: Exception) -> JSONResponse:
        log.error("dependency unavailable: %s", exc)
        return JSONResponse(
            {"detail": f"temporarily unavailable: {exc}"}, status_code=503, headers={"Retry-After": "2"}
        )

    @app.exception_handler(ConcurrencyError)
    async def busy(_: Request, exc: ConcurrencyError) -> JSONResponse:
        return JSONResponse(
            {"detail": "the job is changing right now; try again"},
            status_code=503,
            headers={"Retry-After": "1"},
        )

    return app
