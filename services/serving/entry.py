"""The serving entry point (port 8000 by default): the Open Inference Protocol over the replicas this node
holds (`v2app`), behind the API's bearer tokens (`access.py`), with one hop to another node for a version it
does not hold (`proxy.py`), request bodies within `max_request_bytes` and the model's own limit (`v2app.py`),
and `/metrics` (`metrics.py`, then the service's own figures:
`gpuyard.shared.runtime.servicemetrics`). Health: `/v2/health/live` and `/v2/health/ready`
(the service's own `/healthz` and `/readyz` are on its health port, as every service's).

CORS: the dashboard's pages (`dashboard_origins`) may call it from the browser with their session cookie (the
inference form, the request rates from `/metrics`); a preflight from any other origin is refused, and an answer
to another origin carries no CORS header, so its page cannot read it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import uvicorn
from prometheus_client import CollectorRegistry
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.routing import Route

from gpuyard.services.serving import metrics
from gpuyard.services.serving.access import Access
from gpuyard.services.serving.proxy import Forwarder
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.stats import Stats
from gpuyard.services.serving.v2app import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_REQUEST_ROWS, create_app
from gpuyard.shared.auth.secretfile import ScrapeAuth

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
    *,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_request_rows: int = DEFAULT_MAX_REQUEST_ROWS,
    scrape: ScrapeAuth | None = None,
) -> Starlette:
    """`service_metrics`: the serving process's own figures, served after the models' on /metrics;
    `max_request_bytes` and `max_request_rows`: the request limits (`create_app`), the settings of the same
    names; `scrape`: who may read /metrics (`metrics.endpoint`; None: anyone, as `metrics_auth=off`)."""
    stats = stats if stats is not None else Stats()
    app = create_app(
        registry,
        authorize=access.authorize,
        stats=stats,
        router=forwarder,
        repository_loads=False,
        max_request_bytes=max_request_bytes,
        max_request_rows=max_request_rows,
    )

    prometheus = metrics.endpoint(stats, access, scrape or ScrapeAuth(None), service_metrics)
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


class EntryServer(uvicorn.Server):
    """uvicorn in the service's event loop (`entry_server`)."""

    @contextlib.contextmanager
    def capture_signals(self):  # the service runtime owns SIGTERM/SIGINT
        yield


def entry_server(app: Starlette, host: str, port: int) -> EntryServer:
    """The entry point's HTTP server, to `serve()` in the service's event loop; no access log."""
    return EntryServer(uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False))
