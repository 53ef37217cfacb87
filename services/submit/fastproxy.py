"""Requests into running jobs, `/dev/{id}/…` and `/jobs/{id}/[replicas/{r}/]ports/{port}/…`, without FastAPI's
routing and dependency solving, which cost a quarter of the submit service's part of a proxied request (a dev
environment's JupyterLab polls several times a second): the routes' own functions (`routes_dev.forward`,
`routes_ports.forward`) are called straight from the ASGI scope, and answer what the routes answer.

Only what the routes would take as it is comes this way: a method they serve, and parameters that their own
patterns and bounds accept. Anything else goes on to the FastAPI app, which answers as documented at /docs (a
422 for a port out of range, a 405 for another method); so does a request whose route fails before its body was
read (the store or the bus unavailable: the app's exception handlers answer 503)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuyard.services.submit import routes_dev, routes_ports
from gpuyard.services.submit.fastpath import LEFT_TO_THE_APP

DEV = re.compile(rf"{routes_dev.DEV_PATH}/(?P<job_id>[A-Za-z0-9_-]{{1,64}})/(?P<path>.*)", re.DOTALL)
PORTS = re.compile(
    r"/jobs/(?P<job_id>[^/]+)/(?:replicas/(?P<replica>[0-9]{1,6})/)?ports/(?P<port>[0-9]{1,5})/(?P<path>.*)",
    re.DOTALL,
)
METHODS = frozenset(routes_dev.METHODS) & frozenset(routes_ports.METHODS)
MAX_PORT = 65535


def route_of(path: str) -> Callable[[Request], Awaitable[Response]] | None:
    """The route function that answers `path` as the app's route would; None: left to the app."""
    if (dev := DEV.fullmatch(path)) is not None:
        return lambda request: routes_dev.forward(request, dev["job_id"], dev["path"])
    if (ports := PORTS.fullmatch(path)) is not None and 1 <= int(ports["port"]) <= MAX_PORT:
        replica, port = int(ports["replica"] or 0), int(ports["port"])
        return lambda request: routes_ports.forward(request, ports["job_id"], replica, port, ports["path"])
    return None


class FastProxy:
    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = route_of(scope["path"]) if scope["type"] == "http" and scope["method"] in METHODS else None
        if route is None:
            return await self.app(scope, receive, send)
        read = False

        async def receiving() -> Message:
            nonlocal read
            read = True
            return await receive()

        try:
            response = await route(Request(scope, receiving))
        except LEFT_TO_THE_APP:
            if read:
                raise
            return await self.app(scope, receive, send)
        await response(scope, receive, send)
        return None
