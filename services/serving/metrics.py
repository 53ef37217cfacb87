"""`/metrics`: the per-model request counts and latency histograms of `stats.Stats` in the Prometheus text
format (version 0.0.4), written here: a few lines per model, no client library needed.

Series (labels `tenant`, `model`, `version`):
- `gpuyard_inference_requests_total{...,outcome="success"|"failure"}`
- `gpuyard_inference_request_seconds_bucket{...,le="…"}`, `_sum`, `_count` (from the request's arrival at the
  model to its answer: decoding, batching queue, `session.run`, encoding; a forwarded request counts on the
  node that answers it).

Who reads them (`endpoint`): a scrape with the scrape token (`gpuyard.shared.auth.secretfile.ScrapeAuth`: Prometheus's bearer
token or basic-auth password) or an admin reads every model's series and the service's own figures; a tenant's
own API token or dashboard session reads its own models' series only (the dashboard's request rates); anyone
else gets 401. With `metrics_auth=off` every caller reads everything."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from gpuyard.services.serving.access import Access
from gpuyard.services.serving.errors import ServingError
from gpuyard.services.serving.held import split_key
from gpuyard.services.serving.stats import LATENCY_BUCKETS, Stats
from gpuyard.shared.auth.secretfile import CHALLENGE, REFUSED, ScrapeAuth
from gpuyard.shared.runtime.servicemetrics import render as render_service

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
REQUESTS = "gpuyard_inference_requests_total"
LATENCY = "gpuyard_inference_request_seconds"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(key: str, version: str) -> str:
    tenant, name = split_key(key) if "/" in key else ("", key)
    return f'tenant="{_escape(tenant)}",model="{_escape(name)}",version="{_escape(version)}"'


def render(stats: Stats, tenant: str | None = None) -> str:
    """The series of every model, or of `tenant`'s only."""
    lines = [
        f"# HELP {REQUESTS} Inference requests answered, per model version and outcome.",
        f"# TYPE {REQUESTS} counter",
    ]
    models = sorted(stats.models.items())
    if tenant is not None:
        models = [item for item in models if "/" in item[0][0] and split_key(item[0][0])[0] == tenant]
    for (key, version), s in models:
        labels = _labels(key, version)
        lines.append(f'{REQUESTS}{{{labels},outcome="success"}} {s.success}')
        lines.append(f'{REQUESTS}{{{labels},outcome="failure"}} {s.failure}')
    lines += [
        f"# HELP {LATENCY} Time to answer an inference request, per model version.",
        f"# TYPE {LATENCY} histogram",
    ]
    for (key, version), s in models:
        labels = _labels(key, version)
        cumulative = 0
        for bound, count in zip(LATENCY_BUCKETS, s.buckets, strict=False):
            cumulative += count
            lines.append(f'{LATENCY}_bucket{{{labels},le="{bound:g}"}} {cumulative}')
        lines.append(f'{LATENCY}_bucket{{{labels},le="+Inf"}} {s.count}')
        lines.append(f"{LATENCY}_sum{{{labels}}} {s.latency_sum!r}")
        lines.append(f"{LATENCY}_count{{{labels}}} {s.count}")
    return "\n".join(lines) + "\n"


def endpoint(
    stats: Stats,
    access: Access,
    scrape: ScrapeAuth,
    service_metrics: CollectorRegistry | None = None,
) -> Callable[[Request], Awaitable[Response]]:
    """`GET /metrics` (see above): `service_metrics`, the serving process's own figures, after the models'."""

    async def prometheus(request: Request) -> Response:
        tenant = None
        if not scrape.allows(request.headers.get("authorization")):
            try:
                principal = access.principal(request)
            except ServingError:
                return PlainTextResponse(REFUSED, status_code=401, headers={"WWW-Authenticate": CHALLENGE})
            tenant = None if principal.admin else principal.tenant
        body = render(stats, tenant).encode()
        if service_metrics is not None and tenant is None:
            body += await asyncio.to_thread(render_service, service_metrics)
        return Response(body, media_type=CONTENT_TYPE)

    return prometheus
