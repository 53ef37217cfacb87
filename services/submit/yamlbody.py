"""Job specs in YAML as well as JSON: the routes that take a spec (`POST /v1/jobs`, `POST /v1/jobs/validate`)
read a body of a YAML media type as `gpuyard submit job.yaml` reads the file (`gpuyard.shared.contracts.specfiles.load_spec_text`),
then validate it as they validate JSON: one answer, the same errors, whichever was sent."""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

import yaml
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute

from gpuyard.shared.contracts.specfiles import SpecError, load_spec_text, yaml_problem

YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml")
"""The media types read as YAML (any other goes to FastAPI's JSON reading)."""
MOST_VALUES = 10_000
"""Values a YAML spec may hold beyond one per byte of its text (what its aliases may repeat)."""


def yaml_body(schema_ref: str) -> dict[str, Any]:
    """The `openapi_extra` of a route that takes `schema_ref` in YAML too: its body's YAML media types."""
    schema = {"schema": {"$ref": schema_ref}}
    return {"requestBody": {"content": {media: schema for media in YAML_TYPES}}}


def is_yaml(content_type: str | None) -> bool:
    return (content_type or "").split(";", 1)[0].strip().lower() in YAML_TYPES


def yaml_error(why: str, mark: yaml.Mark | None = None) -> RequestValidationError:
    """A 422 in FastAPI's shape (a list in `detail`): the body, and where in it (line, column from 1)."""
    where = {"line": mark.line + 1, "column": mark.column + 1} if mark is not None else {}
    at = f" (line {where['line']}, column {where['column']})" if where else ""
    return RequestValidationError(
        [
            {
                "type": "yaml_invalid",
                "loc": ["body", *where.values()],
                "msg": f"{why}{at}",
                "input": {},
                "ctx": {"error": why, **where},
            }
        ]
    )


def parsed(body: bytes) -> dict[str, Any]:
    """A YAML body as the mapping it holds, or the 422 that says why it holds none."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise yaml_error(f"not UTF-8 text (byte {exc.start})") from None
    try:
        return load_spec_text(text, filename="<body>")
    except SpecError as exc:
        cause = exc.__cause__
        if isinstance(cause, yaml.YAMLError):
            mark, why = yaml_problem(cause)
            raise yaml_error(f"not valid YAML: {why}", mark) from None
        raise yaml_error(str(exc).removeprefix("<body>: ")) from None


def within(data: Any, budget: int) -> bool:
    """Whether `data` holds at most `budget` values, however deep: YAML's aliases (`*a`) can make a short
    text a structure of billions of values (each alias a copy of what it names, once written out)."""
    todo = [data]
    while todo:
        budget -= 1
        if budget < 0:
            return False
        item = todo.pop()
        if isinstance(item, dict):
            todo += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            todo += item
    return True


def as_json(request: Request, body: bytes) -> Request:
    """`request` with its YAML body given to the route as the same spec in JSON."""
    spec = parsed(body)
    if not within(spec, MOST_VALUES + len(body)):
        raise yaml_error("its aliases repeat more than a job spec holds")
    try:
        data = json.dumps(spec, default=str).encode()  # (a YAML date is its text, as it would be in JSON)
    except (RecursionError, ValueError):
        raise yaml_error("nested too deeply to be a job spec") from None
    headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
    scope = {**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}
    converted = Request(scope, request.receive)
    converted._body = data  # (what Request.body() answers from then on: the body was read)
    return converted


class SpecRoute(APIRoute):
    """A route whose body may come in YAML (`YAML_TYPES`): read here and handed on as JSON; a route without a
    body is left as it is."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handle = super().get_route_handler()
        if self.body_field is None:
            return handle

        async def handle_yaml(request: Request) -> Response:
            if is_yaml(request.headers.get("content-type")):
                request = as_json(request, await request.body())
            return await handle(request)

        return handle_yaml
