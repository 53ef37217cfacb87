"""The Open Inference Protocol v2 over HTTP, as an ASGI app: health, server and model metadata, readiness,
inference with the binary tensor data extension, and the model repository extension (index, load, unload).

Plain Starlette rather than FastAPI: every route reads or writes its body itself (the binary extension is not
JSON), so FastAPI's validation and dependency resolution would only add time on the hot path (measured in
docs/serving.md). Errors are `{"error": "..."}` with the status of their `ServingError`."""

from __future__ import annotations

import inspect
import json
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Protocol

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from services.serving.errors import BadRequest, Forbidden, ServingError
from services.serving.protocol import (
    ModelMetadata,
    RepositoryEntry,
    ServerMetadata,
    decode_request,
    encode_response,
    error_body,
)
from services.serving.registry import ModelRegistry, ModelVersion
from services.serving.runtime import check_inputs
from services.serving.stats import Stats
from shared.version import VERSION

log = logging.getLogger(__name__)

SERVER_NAME = "gpuyard"
EXTENSIONS = ["binary_tensor_data", "model_repository"]
PLATFORM = "onnx_onnxv1"
JSON = "application/json"
BINARY = "application/octet-stream"

Authorize = Callable[[Request, str | None], object]
"""Called before any model route with the model's name (None for the repository index), sync or async:
raises a ServingError (Unauthorized, Forbidden, NotFound) to refuse. To allow, it returns None, or for a model
route the registry key the name stands for (a platform keeps each tenant's models under its own key), or for
the index a function from registry key to the name the caller sees it under (None: not listed)."""


class Router(Protocol):
    """Where a request goes when this server does not hold the version it asks for (the platform's serving
    entry point: `services/serving/entry.py`)."""

    def default_version(self, key: str) -> str | None:
        """The version a request without one gets: the newest ready anywhere (None: none is)."""

    async def forward(self, request: Request, key: str, version: str) -> Response | None:
        """The answer of a server that holds the version (one hop), or None when none does."""


MANAGED_ELSEWHERE = "models are loaded and unloaded by deployments here: `gpuyard models deploy` and `gpuyard models undeploy`"


class _Answer(Response):
    """An inference answer (200) with its headers written out directly: Starlette's Response builds them from a
    mapping on every call, which costs more than the rest of writing the answer."""

    def __init__(self, body: bytes, json_length: int | None):
        self.status_code = 200
        self.background = None
        self.body = body
        if json_length is None:
            self.raw_headers = [(b"content-length", b"%d" % len(body)), (b"content-type", _JSON_TYPE)]
        else:
            self.raw_headers = [
                (b"content-length", b"%d" % len(body)),
                (b"content-type", _BINARY_TYPE),
                (b"inference-header-content-length", b"%d" % json_length),
            ]


_JSON_TYPE = JSON.encode()
_BINARY_TYPE = BINARY.encode()


async def _read_body(request: Request) -> bytes:
    """The request's body, read from ASGI's `receive` itself: `Request.body` goes through an async generator,
    which costs more than the reading."""
    chunks = []
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _error(status: int, message: str) -> Response:
    return Response(error_body(message), status_code=status, media_type=JSON)


async def _serving_error(request: Request, exc: ServingError) -> Response:
    return _error(exc.status, exc.message)


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return _error(exc.status_code, exc.detail)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return _error(500, f"internal error: {exc}")


def create_app(
    registry: ModelRegistry,
    authorize: Authorize | None = None,
    stats: Stats | None = None,
    router: Router | None = None,
    *,
    repository_loads: bool = True,
) -> Starlette:
    """The v2 app over `registry`. `authorize(request, model_name)` runs before each model route (default:
    everyone may do everything); `stats` (also `app.state.stats`) counts requests and their latency per
    model version (under its registry key); `router` sends a request for a version this server does not
    hold to one that does. `repository_loads` False: the repository's load and unload are refused (403), for a
    server whose models come and go with deployments."""
    stats = stats if stats is not None else Stats()

    async def allow(request: Request, name: str | None):
        if authorize is None:
            return None
        result = authorize(request, name)
        if inspect.isawaitable(result):
            result = await result
        return result

    def held(key: str, version: str) -> bool:
        entry = registry.models.get(key, {}).get(int(version)) if version.isdigit() else None
        return entry is not None and entry.ready

    async def model_for(request: Request) -> ModelVersion | Response:
        name = request.path_params["name"]
        key = name if authorize is None else (await allow(request, name) or name)
        version = request.path_params.get("version")
        if router is not None:
            if version is None:
                version = router.default_version(key)
            if version is not None and not held(key, version):
                forwarded = await router.forward(request, key, version)
                if forwarded is not None:
                    return forwarded
        return registry.resolve(key, version)

    async def server_metadata(request: Request) -> Response:
        body = ServerMetadata(name=SERVER_NAME, version=VERSION, extensions=EXTENSIONS)
        return JSONResponse(body.model_dump())

    async def live(request: Request) -> Response:
        return JSONResponse({"live": True})

    async def ready(request: Request) -> Response:
        return JSONResponse({"ready": True})

    async def model_metadata(request: Request) -> Response:
        entry = await model_for(request)
        if isinstance(entry, Response):
            return entry
        model = entry.model
        body = ModelMetadata(
            name=request.path_params["name"],
            versions=[str(v) for v in registry.ready_versions(entry.name)],
            platform=PLATFORM,
            inputs=[spec.metadata() for spec in model.inputs.values()],
            outputs=[spec.metadata() for spec in model.outputs.values()],
        )
        return JSONResponse(body.model_dump())

    async def model_ready(request: Request) -> Response:
        entry = await model_for(request)  # Unavailable (503) when not ready
        if isinstance(entry, Response):
            return entry
        name = request.path_params["name"]
        return JSONResponse({"name": name, "version": str(entry.version), "ready": True})

    async def infer(request: Request) -> Response:
        entry = await model_for(request)
        if isinstance(entry, Response):
            return entry
        started = perf_counter()
        ok = False
        try:
            body = await _read_body(request)
            req = decode_request(body, request.headers.get("inference-header-content-length"))
            model = entry.model
            check_inputs(model, req.inputs, req.datatypes)
            if req.outputs is None:
                wanted = [(spec, req.binary_output) for spec in model.outputs.values()]
            else:
                wanted = []
                for output in req.outputs:
                    spec = model.outputs.get(output.name)
                    if spec is None:
                        raise BadRequest(
                            f"unknown output '{output.name}': the model gives {', '.join(model.outputs)}"
                        )
                    wanted.append((spec, req.binary_output if output.binary is None else output.binary))
            results = await entry.batcher.infer(req.inputs, [spec.name for spec, _ in wanted])
            content, json_length = encode_response(
                request.path_params["name"],
                str(entry.version),
                req.id,
                [(spec.name, spec.datatype, results[spec.name], binary) for spec, binary in wanted],
            )
            ok = True
        finally:
            stats.of(entry.name, str(entry.version)).observe(perf_counter() - started, ok)
        return _Answer(content, json_length)

    async def repository_index(request: Request) -> Response:
        shown = await allow(request, None)
        if not callable(shown):
            shown = None
        body = await request.body()
        ready_only = False
        if body.strip():
            try:
                query = json.loads(body)
            except ValueError as exc:
                raise BadRequest(f"the request's JSON is malformed: {exc}") from None
            ready_only = isinstance(query, dict) and query.get("ready") is True
        entries = [
            RepositoryEntry(name=name, version=str(e.version), state=e.state.value, reason=e.reason)
            for e in registry.index(ready_only)
            if (name := e.name if shown is None else shown(e.name)) is not None
        ]
        return JSONResponse([e.model_dump() for e in entries])

    async def load(request: Request) -> Response:
        name = request.path_params["name"]
        await allow(request, name)
        if not repository_loads:
            raise Forbidden(MANAGED_ELSEWHERE)
        loaded = await registry.load_model(name)
        if not any(entry.ready for entry in loaded):
            reasons = "; ".join(f"version {e.version}: {e.reason}" for e in loaded)
            raise BadRequest(f"failed to load model '{name}': {reasons}")
        return Response(b"", media_type=JSON)

    async def unload(request: Request) -> Response:
        name = request.path_params["name"]
        await allow(request, name)
        if not repository_loads:
            raise Forbidden(MANAGED_ELSEWHERE)
        await registry.unload(name)
        return Response(b"", media_type=JSON)

    model = "/v2/models/{name}"
    version = "/v2/models/{name}/versions/{version}"
    routes = [  # matched in order: inference first
        Route(f"{model}/infer", infer, methods=["POST"]),
        Route(f"{version}/infer", infer, methods=["POST"]),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route(model, model_metadata, methods=["GET"]),
        Route(version, model_metadata, methods=["GET"]),
        Route(f"{model}/ready", model_ready, methods=["GET"]),
        Route(f"{version}/ready", model_ready, methods=["GET"]),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        Route("/v2/repository/models/{name}/load", load, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", unload, methods=["POST"]),
    ]
    app = Starlette(
        routes=routes,
        exception_handlers={
            ServingError: _serving_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
    )
    app.state.registry = registry
    app.state.stats = stats
    return app
