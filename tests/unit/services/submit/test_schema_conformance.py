"""The submit API's OpenAPI document says exactly what the API accepts: for each rule the API fuzzer found the
document and the validation behind it disagreeing on, a request the document takes is not refused as invalid
(400, 422), and one it does not take is (422), each checked against the document (JSON Schema 2020-12) and
against the API."""

from __future__ import annotations

import re
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from gpuyard.shared.contracts.api.common import CURSOR_PATTERN, page_cursor, page_place
from tests.unit.services.submit.onnxmodels import tiny_model
from tests.unit.services.submit.test_submit_api import ADMIN, SPEC, VISION, api, ctx, submit  # noqa: F401 (fixtures)

REFUSED_AS_INVALID = (400, 422)


@pytest.fixture
def document(api):  # noqa: F811
    return api.get("/openapi.json").json()


def body_schema_takes(document: dict, path: str, method: str, body: Any) -> bool:
    """Whether the document's schema of the JSON body of `method path` takes `body`."""
    schema = document["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    root = {**schema, "components": document["components"]}  # (its $refs resolved in the document)
    return Draft202012Validator(root).is_valid(body)


def query_schema_takes(document: dict, path: str, method: str, name: str, value: str) -> bool:
    """Whether the document's schema of the query parameter `name` of `method path` takes `value` (text, as a
    query carries it; a pattern is a match anywhere unless anchored, as JSON Schema says)."""
    [parameter] = [p for p in document["paths"][path][method]["parameters"] if p["name"] == name]
    schema = parameter["schema"]
    texts = [s for s in schema.get("anyOf", [schema]) if s.get("type") == "string"]
    return any(Draft202012Validator(s).is_valid(value) for s in texts)


def refused_as_invalid(response) -> bool:
    return response.status_code in REFUSED_AS_INVALID


@pytest.mark.parametrize(
    ("path", "value", "taken"),
    [
        ("/v1/jobs", page_cursor("2026-11-29T00:00:00+00:00", "5f0c2a9e1b7d4c11"), True),
        ("/v1/jobs", "garbage", True),  # (a place all the same: before every job, newest first)
        ("/v1/jobs", "QQ", True),
        ("/v1/jobs", "", True),
        ("/v1/jobs", "A", False),  # (no base64 text is one character longer than a multiple of 4)
        ("/v1/jobs", "not a cursor", False),
        ("/v1/jobs", "QQ==", False),  # (unpadded)
        ("/v1/alerts", "garbage", True),
        ("/v1/alerts", "//8", False),
        ("/v1/alerts", "__8", True),  # (bytes that are not UTF-8: a place all the same)
    ],
)
def test_a_page_cursor_the_document_takes_is_a_page(api, document, path, value, taken):  # noqa: F811
    assert query_schema_takes(document, path, "get", "cursor", value) is taken
    response = api.get(path, params={"cursor": value}, headers=ADMIN)
    assert refused_as_invalid(response) is not taken, response.text
    if taken:
        assert response.status_code == 200, response.text


def test_a_page_cursor_names_the_place_after_a_pages_last_item():
    cursor = page_cursor("2026-11-29T00:00:00+00:00", "alert/node-1/0")
    assert re.fullmatch(CURSOR_PATTERN, cursor)
    assert page_place(cursor) == ("2026-11-29T00:00:00+00:00", "alert/node-1/0")
    assert page_place("__8") == ("\ufffd\ufffd", "")


def test_pages_follow_each_other_with_the_cursor_the_api_answers(api):  # noqa: F811
    made = [submit(api, name=f"j{i}")["job_id"] for i in range(3)]
    first = api.get("/v1/jobs", params={"limit": 2}, headers=VISION).json()
    assert re.fullmatch(CURSOR_PATTERN, first["next_cursor"])
    rest = api.get("/v1/jobs", params={"limit": 2, "cursor": first["next_cursor"]}, headers=VISION).json()
    assert [j["job_id"] for j in first["items"] + rest["items"]] == made[::-1]


@pytest.mark.parametrize(
    ("path", "params", "value", "taken"),
    [
        ("/v1/usage", {}, "7d", True),
        ("/v1/usage", {}, "1h 30m", True),
        ("/v1/usage", {}, "0.5", True),
        ("/v1/usage", {}, "999d", True),  # (answered for the last 400 days)
        ("/v1/usage", {}, "0", False),
        ("/v1/usage", {}, "0h0m", False),
        ("/v1/usage", {}, "0.0", False),
        ("/v1/usage", {}, "-1h", False),
        ("/v1/usage", {}, "soon", False),
        ("/v1/gpus/history", {"node": "n1"}, "0", False),
        ("/v1/gpus/history", {"node": "n1", "step": 1}, "30d", True),  # (in the finest step it allows)
    ],
)
def test_a_since_the_document_takes_is_a_window(api, document, path, params, value, taken):  # noqa: F811
    assert query_schema_takes(document, path, "get", "since", value) is taken
    response = api.get(path, params={**params, "since": value}, headers=ADMIN)
    assert refused_as_invalid(response) is not taken, response.text


@pytest.mark.parametrize(
    ("body", "taken"),
    [
        ({"tenant": "nlp", "expires_in": 0}, False),
        ({"tenant": "nlp", "expires_in": "0s"}, False),
        ({"tenant": "nlp", "expires_in": -1}, False),
        ({"tenant": "nlp", "expires_in": 0.5}, True),
        ({"tenant": "nlp", "expires_in": "1h30m"}, True),
        ({"tenant": "nlp", "expires_in": "30D"}, True),
        ({"tenant": "nlp", "expires_in": "1h", "expires_at": "2999-01-01T00:00:00Z"}, False),
        ({"tenant": "nlp", "expires_in": None, "expires_at": "2999-01-01T00:00:00Z"}, True),
        ({"tenant": "nlp", "expires_at": 32503680000}, False),  # (a time is RFC 3339 text)
        ({"tenant": "nlp", "admin": 1}, False),
        ({"tenant": "nlp", "admin": "true"}, False),
        ({"tenant": "nlp", "admin": True}, True),
    ],
)
def test_a_token_request_the_document_takes_is_a_token(api, document, body, taken):  # noqa: F811
    assert body_schema_takes(document, "/v1/admin/tokens", "post", body) is taken
    response = api.post("/v1/admin/tokens", json=body, headers=ADMIN)
    assert refused_as_invalid(response) is not taken, response.text


@pytest.mark.parametrize(
    ("body", "taken"),
    [
        ({"gpus": 0, "gpu_memory": "1GB"}, False),
        ({"gpu_memory": 1 << 30}, False),  # (gpus 0 by default)
        ({"gpus": 0, "gpu_memory": None}, True),
        ({"gpus": 0.25, "gpu_memory": "1GB"}, True),
        ({"gpus": 1.5}, False),
        ({"gpus": 0.005}, False),
        ({"gpus": True}, False),
        ({"gpus": "0.5"}, False),
        ({"replicas": True}, False),
        ({"replicas": "2"}, False),
        ({"priority": ""}, False),
        ({"priority": "high"}, True),
        ({"memory": -1}, False),
        ({"memory": "4 GiB"}, True),
        ({"memory": "4 parsecs"}, False),
    ],
)
def test_a_deployment_the_document_takes_is_deployed(api, document, body, taken):  # noqa: F811
    assert api.post("/v1/models", params={"name": "mnist"}, content=tiny_model(), headers=VISION).is_success
    assert body_schema_takes(document, "/v1/models/{name}/deployments", "post", body) is taken
    response = api.post("/v1/models/mnist/deployments", json=body, headers=VISION)
    assert refused_as_invalid(response) is not taken, response.text


@pytest.mark.parametrize(
    ("value", "taken"), [("", False), ("urgent", False), ("low", True), ("critical", True)]
)
def test_a_serve_priority_the_document_takes_is_served(api, document, value, taken):  # noqa: F811
    assert query_schema_takes(document, "/v1/models", "post", "serve_priority", value) is taken
    params = {"name": "mnist", "serve_priority": value}
    response = api.post("/v1/models", params=params, content=tiny_model(), headers=VISION)
    assert refused_as_invalid(response) is not taken, response.text
    if not taken:
        assert response.json()["detail"][0]["loc"] == ["query", "serve_priority"]


@pytest.mark.parametrize(
    ("fields", "taken"),
    [
        ({"max_retries": False}, False),
        ({"max_retries": "3"}, False),
        ({"max_retries": 3}, True),
        ({"replicas": 2.0}, True),  # (an integer, as JSON Schema says)
        ({"timeout": 0}, False),
        ({"timeout": "2h"}, True),
        ({"resources": {"gpus": 1, "cpus": True}}, False),
        ({"idle_timeout": "OFF"}, True),
        ({"idle_timeout": -1}, False),
        ({"priority": "urgent"}, False),
    ],
)
def test_a_spec_the_document_takes_is_queued(api, document, fields, taken):  # noqa: F811
    body = {**SPEC, **fields}
    assert body_schema_takes(document, "/v1/jobs", "post", body) is taken
    response = api.post("/v1/jobs", json=body, headers=VISION)
    assert refused_as_invalid(response) is not taken, response.text


@pytest.mark.parametrize(
    ("body", "taken"), [({"gpu": False}, False), ({"gpu": "0"}, False), ({"gpu": 0}, True)]
)
def test_a_node_control_the_document_takes_is_not_refused_as_invalid(api, document, body, taken):  # noqa: F811
    for action in ("cordon", "drain", "uncordon"):
        assert body_schema_takes(document, f"/v1/nodes/{{node}}/{action}", "post", body) is taken
        response = api.post(f"/v1/nodes/node-1/{action}", json=body, headers=ADMIN)
        assert refused_as_invalid(response) is not taken, response.text  # (404 for the node unknown)


def test_a_model_patch_takes_a_boolean_only(api, document):  # noqa: F811
    assert not body_schema_takes(document, "/v1/models/{name}", "patch", {"public": 1})
    assert api.patch("/v1/models/mnist", json={"public": 1}, headers=VISION).status_code == 422


def test_a_get_of_the_validate_path_is_a_405_that_allows_post(api):  # noqa: F811
    """`/v1/jobs/validate` takes a spec: a GET there is not a job named `validate`."""
    response = api.get("/v1/jobs/validate", headers=VISION)
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == "POST" and "POST" in response.json()["detail"]
