"""The Open Inference Protocol v2 over HTTP, as an ASGI app: health, server and model metadata, readiness,
inference with the binary tensor data extension, and the model repository extension (index, load, unload).

Plain Starlette rather than FastAPI: every route reads or writes its body itself (the binary extension is not
JSON), so FastAPI's validation and dependency resolution would only add time on the hot path (measured in
docs/serving.md). Errors are `{"error": "..."}` with the status of their `ServingError`.

A model is named by its name (`/v2/models/mnist/infer`) or by its owner and name (`/v2/models/vision/mnist/infer`,
tritonclient's `infer("vision/mnist", ...)`): both reach the `authorize` hook as the name the caller wrote
(`vision/mnist`). Where a name and a qualified name could read the same path (`/v2/models/a/ready`), the
protocol's own route wins: model `a`'s readiness.

Request bodies are limited (`max_request_bytes`, and for an inference the most the model's inputs can need at
`max_request_rows` rows: `protocol.body_limit`): over it, 413 from `Content-Length` before the body is read, or
as soon as more than the limit has arrived, and the connection is closed after the answer."""

from __future__ import annotations

import inspect
import json
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Protocol, TypeVar

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gpuyard.services.serving.errors import BadRequest, Forbidden, PayloadTooLarge, ServingError, Unavailable
from gpuyard.services.serving.protocol import (
    InferRequest,
    ModelMetadata,
    RepositoryEntry,
    ServerMetadata,
    TensorSpec,
    body_limit,
    decode_request,
    encode_response,
    error_body,
)
from gpuyard.services.serving.registry import ModelRegistry, ModelVersion
from gpuyard.services.serving.runtime import OnnxModel, check_inputs
from gpuyard.services.serving.stats import Stats
from gpuyard.shared.contracts.version import VERSION
from gpuyard.shared.settings.serving import ServingSettings

log = logging.getLogger(__name__)

SERVER_NAME = "gpuyard"
EXTENSIONS = ["binary_tensor_data", "model_repository"]
PLATFORM = "onnx_onnxv1"
JSON = "application/json"
BINARY = "application/octet-stream"

Authorize = Callable[[Request, str | None], object]
"""Called before any model route with the model's name as the caller wrote it (`mnist`, or `vision/mnist` on
a qualified route; None for the repository index), sync or async: raises a ServingError (Unauthorized,
Forbidden, NotFound, Unavailable) to refuse. To allow, it returns None, or for a model route the registry key
the name stands for (a platform keeps each tenant's models under its own key: a key it returns is a model that
exists, so one this server does not hold is answered 503), or for the index a function from registry key to
the name the caller sees it under (None: not listed)."""

DEFAULT_MAX_REQUEST_BYTES: int = ServingSettings.model_fields["max_request_bytes"].default
DEFAULT_MAX_REQUEST_ROWS: int = ServingSettings.model_fields["max_request_rows"].default


Where = TypeVar("Where")
"""What a `Router` says of where a request goes (its `remote`), handed back to its `forward`."""


class Router(Protocol[Where]):
    """Where a request goes when this server does not hold the version it asks for (the platform's serving
    entry point: `services/serving/entry.py`)."""

    def default_version(self, key: str) -> str | None:
        """The version a request without one gets: the newest ready anywhere (None: none is)."""

    def remote(self, request: Request, key: str, version: str) -> Where | None:
        """Where the request goes instead (one hop), or None when it is answered here."""

    async def forward(self, request: Request, where: Where, name: str, version: str, body: bytes) -> Response:
        """The answer of the server `remote` chose, asked for model `name` (as the caller named it) and
        `version` with the request's `body` (already read, within the limit)."""


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


def declared_length(request: Request) -> int | None:
    """The body's length as `Content-Length` says it (None: not said, a chunked body); read from the ASGI
    scope's headers (lowercase names), a third of what `request.headers` takes."""
    for key, value in request.scope["headers"]:
        if key == b"content-length":
            if not value.isdigit():
                raise BadRequest(f"Content-Length is not a number: {value.decode(errors='replace')!r}")
            return int(value)
    return None


def too_large(limit: int, model: str | None = None, rows: int = 0) -> PayloadTooLarge:
    if model is None:
        return PayloadTooLarge(f"the request body is over {limit} bytes, the most this server reads")
    return PayloadTooLarge(
        f"the request body is over {limit} bytes, the most a request to model '{model}' can need "
        f"(at most {rows} rows of its inputs): send fewer rows per request"
    )


async def read_body(
    request: Request, limit: int, declared: int | None, model: str | None = None, rows: int = 0
) -> bytes:
    """The request's body, at most `limit` bytes: PayloadTooLarge (`too_large(limit, model, rows)`) when
    `declared` (its `Content-Length`) says more, before anything is read, or as soon as more has arrived (the
    rest is never read). Read from ASGI's `receive` itself (`Request.body` goes through an async generator,
    which costs more than the reading), in chunks joined once."""
    if declared is not None and declared > limit:
        raise too_large(limit, model, rows)
    chunks = []
    size = 0
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit, model, rows)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def requested_name(request: Request) -> str:
    """The model's name as the request's path gives it: `mnist`, or `vision/mnist` on a qualified route."""
    params = request.path_params
    owner = params.get("owner")
    return params["name"] if owner is None else f"{owner}/{params['name']}"


def _error(status: int, message: str) -> Response:
    return Response(error_body(message), status_code=status, media_type=JSON)


async def _serving_error(request: Request, exc: ServingError) -> Response:
    response = _error(exc.status, exc.message)
    if isinstance(exc, PayloadTooLarge):
        response.headers["connection"] = "close"  # the rest of the body is never read: the connection ends
    return response


async def _http_error(request: Request, exc: HTTPException) -> Response:
    return _error(exc.status_code, exc.detail)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("internal error on %s %s", request.method, request.url.path)
    return _error(500, f"internal error: {exc}")


@dataclass(eq=False)
class V2Server:
    """What the routes serve and how (`create_app`'s arguments), on the app as `app.state.v2`."""

    registry: ModelRegistry
    authorize: Authorize | None
    stats: Stats
    router: Router[Any] | None
    repository_loads: bool
    max_request_bytes: int
    max_request_rows: int
    limits: weakref.WeakKeyDictionary[OnnxModel, int] = field(default_factory=weakref.WeakKeyDictionary)
    """Each model's own body limit (`protocol.body_limit`), once known."""

    def limit_of(self, model: OnnxModel) -> int:
        limit = self.limits.get(model)
        if limit is None:
            limit = body_limit(model.inputs.values(), self.max_request_rows, self.max_request_bytes)
            self.limits[model] = limit
        return limit

    async def allow(self, request: Request, name: str | None):
        if self.authorize is None:
            return None
        result = self.authorize(request, name)
        if inspect.isawaitable(result):
            result = await result
        return result

    def held(self, key: str, version: str) -> bool:
        entry = self.registry.models.get(key, {}).get(int(version)) if version.isdigit() else None
        return entry is not None and entry.ready

    async def model_for(self, request: Request) -> tuple[str, ModelVersion | Response]:
        """The name as the caller wrote it, and the version that answers here, or the answer of the node
        that holds it (one hop, the body read within `max_request_bytes`)."""
        name = requested_name(request)
        allowed = await self.allow(request, name)
        key = allowed if isinstance(allowed, str) else name
        version = request.path_params.get("version")
        if self.router is not None:
            if version is None:
                version = self.router.default_version(key)
            if version is not None and not self.held(key, version):
                where = self.router.remote(request, key, version)
                if where is not None:
                    body = await read_body(request, self.max_request_bytes, declared_length(request))
                    return name, await self.router.forward(request, where, name, version, body)
        if (
            isinstance(allowed, str) and key not in self.registry.models
        ):  # a model that exists, held nowhere now
            at = "" if version is None else f" version {version}"
            raise Unavailable(f"model '{name}'{at} has no ready replica: wait until one is ready")
        return name, self.registry.resolve(key, version, shown=name)


def served(request: Request) -> V2Server:
    return request.app.state.v2


# --- the routes -----------------------------------------------------------------------------------------


async def server_metadata(request: Request) -> Response:
    body = ServerMetadata(name=SERVER_NAME, version=VERSION, extensions=EXTENSIONS)
    return JSONResponse(body.model_dump())


async def live(request: Request) -> Response:
    return JSONResponse({"live": True})


async def ready(request: Request) -> Response:
    return JSONResponse({"ready": True})


async def model_metadata(request: Request) -> Response:
    v2 = served(request)
    name, entry = await v2.model_for(request)
    if isinstance(entry, Response):
        return entry
    model, _ = entry.loaded()
    body = ModelMetadata(
        name=name,
        versions=[str(v) for v in v2.registry.ready_versions(entry.name)],
        platform=PLATFORM,
        inputs=[spec.metadata() for spec in model.inputs.values()],
        outputs=[spec.metadata() for spec in model.outputs.values()],
    )
    return JSONResponse(body.model_dump())


async def model_ready(request: Request) -> Response:
    name, entry = await served(request).model_for(request)  # Unavailable (503) when not ready
    if isinstance(entry, Response):
        return entry
    return JSONResponse({"name": name, "version": str(entry.version), "ready": True})


async def infer(request: Request) -> Response:
    v2 = served(request)
    declared = declared_length(request)  # (over every limit: refused before the model is even looked up)
    if declared is not None and declared > v2.max_request_bytes:
        raise too_large(v2.max_request_bytes)
    name, entry = await v2.model_for(request)
    if isinstance(entry, Response):
        return entry
    started = perf_counter()
    ok = False
    try:
        content, json_length = await inference(v2, request, name, entry, declared)
        ok = True
    finally:
        v2.stats.of(entry.name, str(entry.version)).observe(perf_counter() - started, ok)
    return _Answer(content, json_length)


async def inference(
    v2: V2Server, request: Request, name: str, entry: ModelVersion, declared: int | None
) -> tuple[bytes, int | None]:
    """The answer's body to an inference request for `entry` (and the length of its JSON part when it has
    binary outputs): the body read within the model's limit, decoded, checked, batched, encoded."""
    model, batcher = entry.loaded()
    limit = v2.limit_of(model)
    named = name if limit < v2.max_request_bytes else None  # (the model's own limit, else the server's)
    body = await read_body(request, limit, declared, named, v2.max_request_rows)
    req = decode_request(body, request.headers.get("inference-header-content-length"))
    check_inputs(model, req.inputs, req.datatypes)
    check_rows(model, req, v2.max_request_rows)
    wanted = wanted_outputs(model, req)
    try:
        results = await batcher.infer(req.inputs, [spec.name for spec, _ in wanted])
    except Unavailable as exc:  # unloaded while the body was read (a redeploy): say which model
        raise Unavailable(f"model '{name}' version {entry.version}: {exc.message}") from None
    return encode_response(
        name,
        str(entry.version),
        req.id,
        [(spec.name, spec.datatype, results[spec.name], binary) for spec, binary in wanted],
    )


def check_rows(model: OnnxModel, req: InferRequest, max_rows: int) -> None:
    """PayloadTooLarge for an input with more than `max_rows` rows on the model's dynamic first dimension."""
    for input_name, array in req.inputs.items():
        if model.inputs[input_name].shape[:1] == (-1,) and array.shape[0] > max_rows:
            raise PayloadTooLarge(
                f"input '{input_name}' has {array.shape[0]} rows: at most {max_rows} in one "
                "request; send fewer rows per request"
            )


def wanted_outputs(model: OnnxModel, req: InferRequest) -> list[tuple[TensorSpec, bool]]:
    """The outputs the request asks for (every output of the model when it names none), each with whether it
    is answered binary."""
    if req.outputs is None:
        return [(spec, req.binary_output) for spec in model.outputs.values()]
    wanted = []
    for output in req.outputs:
        spec = model.outputs.get(output.name)
        if spec is None:
            raise BadRequest(f"unknown output '{output.name}': the model gives {', '.join(model.outputs)}")
        wanted.append((spec, req.binary_output if output.binary is None else output.binary))
    return wanted


async def repository_index(request: Request) -> Response:
    v2 = served(request)
    shown = await v2.allow(request, None)
    if not callable(shown):
        shown = None
    body = await read_body(request, v2.max_request_bytes, declared_length(request))
    ready_only = False
    if body.strip():
        try:
            query = json.loads(body)
        except ValueError as exc:
            raise BadRequest(f"the request's JSON is malformed: {exc}") from None
        ready_only = isinstance(query, dict) and query.get("ready") is True
    entries = [
        RepositoryEntry(name=name, version=str(e.version), state=e.state.value, reason=e.reason)
        for e in v2.registry.index(ready_only)
        if (name := e.name if shown is None else shown(e.name)) is not None
    ]
    return JSONResponse([e.model_dump() for e in entries])


async def load(request: Request) -> Response:
    v2 = served(request)
    name = request.path_params["name"]
    await v2.allow(request, name)
    if not v2.repository_loads:
        raise Forbidden(MANAGED_ELSEWHERE)
    loaded = await v2.registry.load_model(name)
    if not any(entry.ready for entry in loaded):
        reasons = "; ".join(f"version {e.version}: {e.reason}" for e in loaded)
        raise BadRequest(f"failed to load model '{name}': {reasons}")
    return Response(b"", media_type=JSON)


async def unload(request: Request) -> Response:
    v2 = served(request)
    name = request.path_params["name"]
    await v2.allow(request, name)
    if not v2.repository_loads:
        raise Forbidden(MANAGED_ELSEWHERE)
    await v2.registry.unload(name)
    return Response(b"", media_type=JSON)


def v2_routes() -> list[Route]:
    """The protocol's routes, matched in order: inference first, a name before a qualified name."""
    model = "/v2/models/{name}"
    version = "/v2/models/{name}/versions/{version}"
    owned = "/v2/models/{owner}/{name}"  # another tenant's model, by its qualified name OWNER/NAME
    owned_version = "/v2/models/{owner}/{name}/versions/{version}"
    models = (model, version, owned, owned_version)
    return [
        *(Route(f"{path}/infer", infer, methods=["POST"]) for path in models),
        Route("/v2", server_metadata, methods=["GET"]),
        Route("/v2/health/live", live, methods=["GET"]),
        Route("/v2/health/ready", ready, methods=["GET"]),
        Route(model, model_metadata, methods=["GET"]),
        Route(version, model_metadata, methods=["GET"]),
        Route(f"{model}/ready", model_ready, methods=["GET"]),
        Route(f"{version}/ready", model_ready, methods=["GET"]),
        Route(owned, model_metadata, methods=["GET"]),
        Route(owned_version, model_metadata, methods=["GET"]),
        Route(f"{owned}/ready", model_ready, methods=["GET"]),
        Route(f"{owned_version}/ready", model_ready, methods=["GET"]),
        Route("/v2/repository/index", repository_index, methods=["POST"]),
        Route("/v2/repository/models/{name}/load", load, methods=["POST"]),
        Route("/v2/repository/models/{name}/unload", unload, methods=["POST"]),
    ]


def create_app(
    registry: ModelRegistry,
    authorize: Authorize | None = None,
    stats: Stats | None = None,
    router: Router[Any] | None = None,
    *,
    repository_loads: bool = True,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_request_rows: int = DEFAULT_MAX_REQUEST_ROWS,
) -> Starlette:
    """The v2 app over `registry`. `authorize(request, model_name)` runs before each model route (default:
    everyone may do everything); `stats` (also `app.state.stats`) counts requests and their latency per
    model version (under its registry key); `router` sends a request for a version this server does not
    hold to one that does. `repository_loads` False: the repository's load and unload are refused (403), for a
    server whose models come and go with deployments. `max_request_bytes`: the largest body read;
    `max_request_rows`: the most rows an inference request may carry on a model's dynamic first dimension,
    which with the model's inputs gives its requests a tighter limit (`protocol.body_limit`)."""
    stats = stats if stats is not None else Stats()
    app = Starlette(
        routes=v2_routes(),
        exception_handlers={
            # (Starlette calls each handler with its own class of exception: its types say any exception)
            ServingError: _serving_error,  # type: ignore[dict-item]
            HTTPException: _http_error,  # type: ignore[dict-item]
            Exception: _internal_error,
        },
    )
    app.state.v2 = V2Server(
        registry, authorize, stats, router, repository_loads, max_request_bytes, max_request_rows
    )
    app.state.registry = registry
    app.state.stats = stats
    return app
