"""Fuzz every operation of the submit API's OpenAPI document with schemathesis, in process (ASGI), with an
admin's bearer token, and every one of schemathesis's checks (`--checks all`): no answer is a 5xx, every
answer is one the document names, with its content type, its schema and its headers; a method a path does not
take is a 405 whose `Allow` names exactly the methods the document gives it; the token is not ignored; a request
the document takes is not refused as invalid (400, 422), and one it does not take is refused (4xx): the document
says exactly what the API accepts. One refusal is not the document's to say: a 422 with one reason (`detail` a
string, `ErrorOut`), for what the platform holds when the request comes (no node could ever hold the job, a file
that is not an ONNX model, an expiry already past): `refused_for_what_the_platform_holds`.
Bounded (examples per operation); derandomized in the quick run, with a fresh seed in the deep one
(`tests/fuzz/depth.py`).

Nothing is opened or written while the module is imported or collected: the operations come from the document,
which the routes alone make; the app the cases are sent to, with its stores in a temporary folder, is a module
fixture, closed and removed at the end, which the schema reaches through `APP` (a check sends requests of its
own: the method not allowed, the request without its token). (schemathesis.pytest.from_fixture, which would
load the whole schema from a fixture, does not work with pytest 9.)"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import negative_data_rejection, positive_data_acceptance

from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.context import JobOutputs, SubmitContext
from gpuyard.services.submit.queuedepth import QueueDepth
from gpuyard.services.submit.routes_artifacts import EXAMPLE_JOB
from gpuyard.services.submit.volumefolders import FolderVolumes
from gpuyard.services.submit.yamlbody import YAML_TYPES
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.contracts.api.tenants import MAX_TOKEN_SECONDS
from gpuyard.shared.contracts.events.alerts import AlertRaised
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.events.nodes import (
    GpuHolder,
    GpuInfo,
    GpuReading,
    NodeAction,
    NodeControlChanged,
    NodeHeartbeat,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.modelfiles.store import ModelStore
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.gpuhistory.base import GpuHistory, GpuPoint, history_path_beside
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.logs import open_log_store
from gpuyard.shared.stores.readmodels import nodecontrol
from gpuyard.shared.stores.readmodels.alertbook import AlertBook
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeRegistry
from tests.fuzz.depth import FUZZ_SEED, pick
from tests.unit.services.submit.onnxmodels import tiny_model

ADMIN = {"Authorization": "Bearer tok-admin"}
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
        volumes=VolumeRegistry(store, None, "/fuzz"),
        volume_files=FolderVolumes(folder / "storage", lambda tenant: None),
        volume_default_size=1 << 20,
        volume_quotas={"*": 8 << 20},
        job_outputs=JobOutputs(folder / "storage", lambda tenant: None),
    )
    asyncio.run(ctx.models.publish(tenant="ops", name="mnist", data=tiny_model()))
    volume = asyncio.run(ctx.volumes.create("ops", "x", 1 << 20, 0, "root"))  # one for the volume routes
    ctx.volume_files.make(volume.tenant, volume.name)
    keep_outputs(ctx, folder / "storage")
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


def keep_outputs(ctx: SubmitContext, root: Path) -> None:
    """A job of the artifacts routes' example id that kept a file and a folder, for them to answer about."""
    job = JobSubmitted(
        job_id=EXAMPLE_JOB, name="kept", tenant="vision", user="ana", spec=JobSpec(command="true")
    )
    asyncio.run(ctx.ledger.append(EXAMPLE_JOB, job, new=True))
    kept = root / "outputs" / "vision" / EXAMPLE_JOB
    (kept / "metrics").mkdir(parents=True)
    (kept / "model.onnx").write_bytes(tiny_model())
    (kept / "metrics" / "loss.tsv").write_text("0\t1.5\n")


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


def test_a_token_expiring_after_year_9999_expires_in_100_years(app):
    """Found by the fuzzer (a 500: the expiry overflowed the date); kept here as it was found. The document takes
    any duration: a token lives 100 years at most."""
    body = {"tenant": "0", "admin": False, "expires_in": 251606386652.0}
    response = TestClient(app).post("/v1/admin/tokens", json=body, headers=ADMIN)
    assert response.status_code == 201, response.text
    expires = datetime.fromisoformat(response.json()["expires"])
    assert expires - datetime.now(UTC) <= timedelta(seconds=MAX_TOKEN_SECONDS)
    assert expires - datetime.now(UTC) > timedelta(seconds=MAX_TOKEN_SECONDS) - timedelta(days=1)
    TestClient(app).delete(f"/v1/admin/tokens/{response.json()['id']}", headers=ADMIN)


SHARED_PATHS = [  # (each taken by several routes: Starlette's own 405 named the first one's method alone)
    "/v1/jobs",
    "/v1/models",
    "/v1/models/x",
    "/v1/models/x/versions/1",
    "/v1/models/x/deployments",
    "/v1/admin/tokens",
    "/v1/volumes",
    "/v1/volumes/x",
    "/v1/volumes/x/content",
]  # (/v1/jobs/{id}/artifacts and …/content take GET alone: Starlette's 405 names it)


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
    excluded = []
    if case.path in NEED_THE_BUS and response.status_code == 503 and NO_BUS in response.text:
        excluded.append(not_a_server_error)  # documented, and true here: no NATS
    if refused_for_what_the_platform_holds(response) or refused_for_a_rule_said_in_words(response):
        excluded.append(positive_data_acceptance)
    if names_an_unknown_query_parameter(case):
        excluded.append(negative_data_rejection)
    case.validate_response(response, headers=ADMIN, excluded_checks=excluded)


def names_an_unknown_query_parameter(case) -> bool:
    """A request with a query parameter the document does not name, or one named twice that takes one value:
    the API ignores the first (FastAPI reads the last value), as HTTP APIs do (a newer client's parameter
    reaches an older server harmlessly), where the document says neither is allowed (FastAPI declares no
    `additionalProperties` of a query). Refusing them would change what every client may send, on every route
    (a middleware matching each request to its route's parameters): not done; the rest of the negations are
    checked by the cases that have neither."""
    operation = DOCUMENT["paths"].get(case.operation.path, {}).get(case.operation.method.lower(), {})
    declared = {p["name"]: p.get("schema", {}) for p in operation.get("parameters", []) if p["in"] == "query"}
    for name, value in (case.query or {}).items():
        if name not in declared:
            return True
        takes_many = "array" in json.dumps(declared[name])
        if isinstance(value, list) and not takes_many:
            return True
    return False


def refused_for_a_rule_said_in_words(response) -> bool:
    """A spec refused only for rules the document says in words, where a schema cannot say them: an
    `idle_timeout` or `idle_grace` over 30 days written as text ('31d', '29d48h': a pattern cannot bound a sum
    of parts; its number form is bounded by `maximum`), and one volume, or one path, mounted twice (a schema
    cannot say that a list's items differ by one field)."""
    if response.status_code != 422:
        return False
    errors = response.json()["detail"]
    return isinstance(errors, list) and all(
        e["loc"][-1] in ("idle_timeout", "idle_grace")
        and "at most 30 days" in e["msg"]
        or e["loc"][-1] == "volumes"
        and "mounted once" in e["msg"]
        for e in errors
    )


def refused_for_what_the_platform_holds(response) -> bool:
    """A 422 with one reason (`ErrorOut`: `detail` a string), as the document says of the routes that answer
    one (`errors.REFUSED_422`): a request the document takes, refused for what the platform holds (its nodes,
    the file's contents, the time), not for its shape, which a refusal of the fields says (`detail` a list)."""
    if response.status_code != 422:
        return False
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("detail"), str)
