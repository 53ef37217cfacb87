"""Fuzz every operation of the submit API's OpenAPI document with schemathesis, in process (ASGI), with an
admin's bearer token, and schemathesis's checks (`--checks all`, less the two in NOT_YET): no answer is a 5xx,
every answer is one the document names, with its content type, its schema and its headers; a method a path does
not take is a 405 whose `Allow` names exactly the methods the document gives it; the token is not ignored.
Bounded (examples per operation); derandomized in the quick run, with a fresh seed in the deep one
(`tests/fuzz/depth.py`).

Nothing is opened or written while the module is imported or collected: the operations come from the document,
which the routes alone make; the app the cases are sent to, with its stores in a temporary folder, is a module
fixture, closed and removed at the end, which the schema reaches through `APP` (a check sends requests of its
own: the method not allowed, the request without its token). (schemathesis.pytest.from_fixture, which would
load the whole schema from a fixture, does not work with pytest 9.)"""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from services.submit.app import create_app
from services.submit.context import SubmitContext
from services.submit.queuedepth import QueueDepth
from services.submit.yamlbody import YAML_TYPES
from shared import nodecontrol
from shared.alertbook import AlertBook
from shared.events import (
    AlertRaised,
    GpuHolder,
    GpuInfo,
    GpuReading,
    NodeAction,
    NodeControlChanged,
    NodeHeartbeat,
    make_event,
)
from shared.gpuhistory import GpuHistory, GpuPoint, history_path_beside
from shared.ledger import JobLedger
from shared.logstore import open_log_store
from shared.modelregistry import ModelRegistry
from shared.modelstore import ModelStore
from shared.store import open_store
from shared.tokens import Tokens
from tests.fuzz.depth import FUZZ_SEED, pick
from tests.unit.onnxmodels import tiny_model

ADMIN = {"Authorization": "Bearer tok-admin"}
NOT_YET = [negative_data_rejection, positive_data_acceptance]
"""schemathesis's checks left out: each finds a schema looser or stricter than the validation behind it (a
negative `since` refused 400 where the schema says any string, a spec with a number where the schema says a
boolean accepted, a page cursor of any text, a serve_priority of any text...). Every other check runs."""
NEED_THE_BUS = {"/v1/events/stream", "/v1/deadletters"}
NO_BUS = "the event bus is not connected"
EXAMPLES = pick(40, 600)  # per operation: the whole document in about 30 s on two cores, 5 min deep


def build_app(folder: Path):
    """The real app on an embedded store in `folder`, with tokens of an admin and a tenant, a model store
    holding one model (`mnist`, so that the model routes find one to answer about) and one alert recorded; no
    bus (the routes that need it answer 503, as documented)."""
    store = asyncio.run(open_store(f"sqlite:///{folder / 'events.db'}"))
    logs = asyncio.run(open_log_store(f"sqlite:///{folder / 'logs.db'}"))
    tokens_file = folder / "tokens.json"
    tokens_file.write_text('{"tokens": {}}')
    ctx = SubmitContext(
        store=store,
        ledger=JobLedger(store, None, "/fuzz"),
        tokens=Tokens(tokens_file, "tok-admin=ops:root:admin,tok-vision=vision:ana"),
        logs=logs,
        max_body_bytes=65536,
        queue=QueueDepth(limit=50),
        models=ModelRegistry(store, None, "/fuzz", ModelStore(str(folder / "models"))),
        max_model_bytes=1 << 20,
        publish_secret_file=folder / "publish.key",
    )
    asyncio.run(ctx.models.publish(tenant="ops", name="mnist", data=tiny_model()))
    alert = AlertRaised(  # so that the alerts route has one to answer about
        alert_id="gpu_idle/node-1/0/j1",
        kind="gpu_idle",
        message="idle",
        tenant="vision",
        job_id="j1",
        value=1.5,
    )
    asyncio.run(AlertBook(store).record(make_event(alert, source="/fuzz")))
    asyncio.run(one_gpu_sample(folder / "events.db"))  # so that the history and usage routes have one
    known = NodeControlChanged(node="node-1", action=NodeAction.UNCORDON, by="root")  # (the routes' example)
    asyncio.run(nodecontrol.record(store, make_event(known, source="/fuzz")))  # a node for them to act on
    node = NodeHeartbeat(  # heard from: a job it could never hold is refused (422 with one reason)
        node="node-1", gpus=[GpuInfo(index=0, uuid="GPU-0", model="H100", memory_bytes=80 << 30)], cpus=8,
        memory_bytes=64 << 30, interval_seconds=3600,
    )  # fmt: skip
    ctx.telemetry.observe(make_event(node, source="/fuzz"))
    return create_app(ctx), (store, logs)


async def one_gpu_sample(events_db: Path) -> None:
    holder = GpuHolder(job_id="j1", tenant="vision", user="ana", fraction=0.5)
    reading = GpuReading(
        index=0, uuid="GPU-0", utilization_pct=50.0, memory_used_bytes=1 << 30, holders=[holder]
    )
    history = await GpuHistory.open(history_path_beside(events_db))
    await history.add([GpuPoint.raw("node-1", reading, time.time() - 10, 1.0)])
    await history.close()


def routes_document() -> dict:
    """The API's OpenAPI document, made from its routes alone: `create_app` reads nothing of its context but the
    body limits, so a context without stores serves, and nothing is opened or written."""
    no_stores = SubmitContext(store=None, ledger=None, tokens=None, logs=None)  # type: ignore[arg-type]
    return create_app(no_stores).openapi()


class LateApp:
    """The ASGI app the schema sends to: the module fixture's, once it is built (nothing is at import)."""

    target = None

    async def __call__(self, scope, receive, send):
        assert self.target is not None, "the app fixture is not built"
        await self.target(scope, receive, send)


APP = LateApp()
DOCUMENT = routes_document()
schema = schemathesis.openapi.from_dict(DOCUMENT)
schema.app = APP  # (the checks that send requests of their own reach the app too)
if FUZZ_SEED is not None:
    schema.config.seed = FUZZ_SEED  # each operation's inputs follow from it and the operation's name


@pytest.fixture(scope="module")
def app():
    """The real app, its stores in a temporary folder; closed and removed when the module's tests are done."""
    folder = Path(tempfile.mkdtemp(prefix="gpuyard-fuzz-"))
    try:
        built, stores = build_app(folder)
        APP.target = built
        try:
            yield built
        finally:
            APP.target = None
            history = getattr(built.state, "gpu_history", None)  # (opened by the first history request)
            for store in (*stores, *([history] if history is not None else [])):
                asyncio.run(store.close())
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_fuzzed_document_is_the_one_the_app_serves(app):
    assert TestClient(app).get("/openapi.json").json() == DOCUMENT


def test_a_token_expiring_after_year_9999_is_refused_with_its_reason(app):
    """Found by the fuzzer (a 500: the expiry overflowed the date); kept here as it was found."""
    body = {"tenant": "0", "admin": False, "expires_in": 251606386652.0}
    response = TestClient(app).post("/v1/admin/tokens", json=body, headers=ADMIN)
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "expires_in"]
    assert "year 9999" in response.json()["detail"][0]["msg"]


SHARED_PATHS = [  # (each taken by several routes: Starlette's own 405 named the first one's method alone)
    "/v1/jobs",
    "/v1/models",
    "/v1/models/x",
    "/v1/models/x/versions/1",
    "/v1/models/x/deployments",
    "/v1/admin/tokens",
]


@pytest.mark.parametrize("path", SHARED_PATHS)
def test_a_method_a_path_does_not_take_is_a_405_whose_allow_names_every_method_it_takes(app, path):
    """Found by the fuzzer's `unsupported_method` and `allow_header_conformance` checks; kept here as found."""
    template = next(t for t in DOCUMENT["paths"] if re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", t), path))
    documented = {m.upper() for m in DOCUMENT["paths"][template]}
    client = TestClient(app)
    for method in {"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"} - documented:
        response = client.request(method, path, headers=ADMIN)
        assert response.status_code == 405, (method, response.text)
        allowed = {m.strip() for m in response.headers["allow"].split(",")}
        assert allowed - {"HEAD"} == documented, (method, response.headers["allow"])


def test_a_deployment_no_node_could_hold_is_a_422_with_its_one_reason_as_the_document_says(app):
    """A `detail` that is a string where the document said a list of fields (the deployment's jobs are
    refused as `POST /v1/jobs` refuses them): kept here as found."""
    response = TestClient(app).post("/v1/models/mnist/deployments", json={"gpus": 8}, headers=ADMIN)
    assert response.status_code == 422 and "no node could ever hold" in response.json()["detail"]
    declared = DOCUMENT["paths"]["/v1/models/{name}/deployments"]["post"]["responses"]["422"]
    refs = [s["$ref"] for s in declared["content"]["application/json"]["schema"]["anyOf"]]
    assert "#/components/schemas/ErrorOut" in refs


def test_the_spec_routes_are_fuzzed_with_yaml_bodies_too():
    """A spec may come in YAML (`services/submit/yamlbody.py`): the document says so, so the fuzzer sends
    YAML bodies (schemathesis serializes each media type a body names) as well as JSON."""
    paths = DOCUMENT["paths"]
    for path in ("/v1/jobs", "/v1/jobs/validate"):
        assert set(YAML_TYPES) | {"application/json"} == set(paths[path]["post"]["requestBody"]["content"])
    assert "/v1/tenants" in paths


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=FUZZ_SEED is None,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_every_answer_is_documented_and_none_is_a_server_error(app, case):
    response = case.call(headers=ADMIN)
    excluded = list(NOT_YET)
    if case.path in NEED_THE_BUS and response.status_code == 503 and NO_BUS in response.text:
        excluded.append(not_a_server_error)  # documented, and true here: no NATS
    case.validate_response(response, headers=ADMIN, excluded_checks=excluded)
