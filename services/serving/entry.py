"""The serving entry point (port 8000 by default): the Open Inference Protocol over the replicas this node
holds (`v2app`), behind the API's bearer tokens (`access.py`), with one hop to another node for a version it
does not hold (`proxy.py`), and `/metrics` (`metrics.py`, then the service's own figures:
`shared.servicemetrics`). Health: `/v2/health/live` and `/v2/health/ready`
(the service's own `/healthz` and `/readyz` are on its health port, as every service's).

CORS: the dashboard's pages (`dashboard_origins`) may call it from the browser with their session cookie (the
inference form, the request rates from `/metrics`); a preflight from any other origin is refused, and an answer
to another origin carries no CORS header, so its page cannot read it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.serving import metrics
from services.serving.access import Access
from services.serving.proxy import Forwarder
from services.serving.registry import ModelRegistry
from services.serving.stats import Stats
from services.serving.v2app import create_app
from shared.servicemetrics import render

CORS_METHODS = ["GET", "POST"]
CORS_HEADERS = ["content-type", "x-csrf-token", "inference-header-content-length"]
CORS_MAX_AGE = 600


def create_entry_app(
    registry: ModelRegistry,
    access: Access,
    forwarder: Forwarder,
    stats: Stats | None = None,
    service_metrics: CollectorRegistry | None = None,
    dashboard_origins: Iterable[str] = (),
) -> Starlette:
    """`service_metrics`: the serving process's own figures, served after the models' on /metrics."""
    stats = stats if stats is not None else Stats()
    app = create_app(
        registry, authorize=access.authorize, stats=stats, router=forwarder, repository_loads=False
    )

    async def prometheus(request: Request) -> Response:
        body = metrics.render(stats).encode()
        if service_metrics is not None:
            body += await asyncio.to_thread(render, service_metrics)
        return Response(body, media_type=metrics.CONTENT_TYPE)

    app.router.routes.append(Route("/metrics", prometheus, methods=["GET"]))
    origins = sorted(dashboard_origins)
    if origins:  # (a request without Origin, every client but a browser's page, passes straight through)
        app.add_middleware(
            CORSMiddleware,
            allow_origins=origins,
            allow_credentials=True,
            allow_methods=CORS_METHODS,
            allow_headers=CORS_HEADERS,
            expose_headers=["inference-header-content-length"],
            max_age=CORS_MAX_AGE,
        )
    return app
