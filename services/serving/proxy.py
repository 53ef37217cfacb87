"""The one hop: a request for a version this node does not hold goes to the serving service of a node that
holds a ready replica of it (`routing.Routes`), over a kept-alive HTTP connection, and its answer comes back
as it is. A forwarded request carries `Gpuyard-Hop`, and a request that carries it is never forwarded again:
at most one hop, whatever the routes say. The body goes on as the v2 app read it, within `max_request_bytes`
(the node that answers applies the model's own limit)."""

from __future__ import annotations

import logging
from urllib.parse import quote

import httpx
from starlette.requests import Request
from starlette.responses import Response

from gpuyard.services.serving.protocol import error_body
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Route, Routes

log = logging.getLogger(__name__)

HOP_HEADER = "gpuyard-hop"
SENT_ON = ("authorization", "content-type", "inference-header-content-length", "accept")
SENT_ON_SESSION = ("cookie", "x-csrf-token", "origin")
"""A dashboard session's request (no Authorization) is checked again where it lands, as a token's is."""
SENT_BACK = ("content-type", "inference-header-content-length")
TIMEOUT = httpx.Timeout(60.0, connect=5.0)


class Forwarder:
    """The v2 app's `Router` over this node's registry and the routes of every node."""

    def __init__(self, registry: ModelRegistry, routes: Routes, client: httpx.AsyncClient | None = None):
        self.registry = registry
        self.routes = routes
        self.client = client or httpx.AsyncClient(timeout=TIMEOUT)

    def default_version(self, key: str) -> str | None:
        newest = max([*self.registry.ready_versions(key), *self.routes.versions(key)], default=None)
        return None if newest is None else str(newest)

    def remote(self, request: Request, key: str, version: str) -> Route | None:
        """A replica of the version on another node; None for a request that was forwarded already."""
        if request.headers.get(HOP_HEADER) or not version.isdigit():
            return None
        return self.routes.remote(key, int(version))

    async def forward(self, request: Request, route: Route, name: str, version: str, body: bytes) -> Response:
        """Ask the node of `route` for model `name` as the caller named it (the node it lands on decides again
        what the name stands for, with the same credentials)."""
        path = request.url.path
        tail = next((t for t in ("/infer", "/ready") if path.endswith(t)), "")
        target = f"{route.endpoint}/v2/models/{quote(name, safe='/')}/versions/{version}{tail}"
        sent = SENT_ON if "authorization" in request.headers else SENT_ON + SENT_ON_SESSION
        headers = {h: v for h in sent if (v := request.headers.get(h)) is not None}
        headers[HOP_HEADER] = "1"
        try:
            answer = await self.client.request(request.method, target, content=body, headers=headers)
        except httpx.HTTPError as exc:
            log.warning("forwarding to %s (node %s) failed: %r", route.endpoint, route.node, exc)
            return Response(
                error_body(f"the replica on node {route.node} did not answer: {type(exc).__name__}"),
                status_code=502,
                media_type="application/json",
            )
        back = {h: v for h in SENT_BACK if (v := answer.headers.get(h)) is not None}
        return Response(answer.content, status_code=answer.status_code, headers=back)

    async def close(self) -> None:
        await self.client.aclose()
