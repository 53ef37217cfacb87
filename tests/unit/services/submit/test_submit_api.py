"""The submit API over HTTP, against a real embedded store (no NATS: events are stored, not published)."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.context import JobOutputs
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    GpuShare,
    JobFailed,
    JobPending,
    JobPlaced,
    JobPreempted,
    JobReplicaExited,
    JobStarted,
    JobSubmitted,
    PendingReason,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.reasons import waiting_message
from gpuyard.shared.contracts.stops import PreemptionCause, preemption_text
from gpuyard.shared.stores.gpuhistory.base import GpuHistory, GpuPoint, history_path_beside
from gpuyard.shared.stores.logs import LogKey, split
from gpuyard.shared.stores.readmodels.queueline import LINE_KEY, READ_SECONDS, line_doc
from tests.unit.services.submit.onnxmodels import tiny_model
from tests.unit.services.submit.submitctx import submit_context

TOKENS = {  # as a tokens file of the format before tokens were hashed holds them
    "tok-vision": {"tenant": "vision", "user": "ana"},
    "tok-nlp": {"tenant": "nlp", "user": "bo"},
    "tok-admin": {"tenant": "ops", "user": "root", "admin": True},
    "tok-dotted": {"tenant": "team.a", "user": "cy"},  # written in the file by hand: not a valid tenant
}
VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}
ADMIN = {"Authorization": "Bearer tok-admin"}
SPEC = {"name": "train", "command": "python train.py", "resources": {"gpus": 1}}


@pytest.fixture
def ctx(tmp_path):
    with submit_context(
        tmp_path,
        TOKENS,
        models=True,
        volumes=True,
        max_body_bytes=4096,
        max_model_bytes=1 << 20,
        publish_secret_file=tmp_path / "publish.key",
        job_outputs=JobOutputs(tmp_path / "storage", lambda tenant: None),
    ) as c:
        yield c


@pytest.fixture
def api(ctx):
    with TestClient(create_app(ctx)) as client:
        yield client


def submit(api, headers=VISION, **overrides):
    response = api.post("/v1/jobs", json={**SPEC, **overrides}, headers=headers)
    assert response.status_code == 202, response.text
    return response.json()


def test_a_job_of_a_tenant_whose_name_cannot_end_a_subject_is_refused_with_the_rule(api):
    """Job events are published on `job.<kind>.<tenant>`: a tenant with '.', '*', '>' or a space would be
    several subject tokens, or a wildcard."""
    refused = api.post("/v1/jobs", json=SPEC, headers={"Authorization": "Bearer tok-dotted"})
    assert refused.status_code == 422 and "'team.a' is not a valid tenant name" in refused.json()["detail"]
    assert "lowercase letters, digits and '-'" in refused.json()["detail"]
    spec = api.post("/v1/jobs", json={**SPEC, "tenant": "a.>"}, headers=ADMIN)  # the spec's rule says so too
    assert spec.status_code == 422 and "tenant" in spec.text
    assert api.get("/v1/jobs", headers=ADMIN).json()["items"] == []


def test_submit_answers_202_with_the_job_id_and_the_job_is_queued(api):
    accepted = submit(api)
    assert accepted["state"] == "queued" and accepted["tenant"] == "vision" and accepted["name"] == "train"
    job = api.get(f"/v1/jobs/{accepted['job_id']}", headers=VISION).json()
    assert job["state"] == "queued" and job["user"] == "ana" and job["gpus"] == 1
    events = api.get(f"/v1/jobs/{accepted['job_id']}/events", headers=VISION).json()
    assert [(e["version"], e["event"]["type"]) for e in events] == [(1, "io.gpuyard.job.submitted")]


def test_invalid_spec_gets_422_naming_the_field(api):
    response = api.post("/v1/jobs", json={**SPEC, "resources": {"gpus": 1.5}}, headers=VISION)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"][-2:] == ["resources", "gpus"]
    unknown = api.post("/v1/jobs", json={**SPEC, "gpu": 2}, headers=VISION)
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"][-1] == "gpu"
    assert api.post("/v1/jobs", content=b"{not json", headers=VISION).status_code == 422


# what reaches exec, an environment or a path with a NUL byte in it (a C string ends at it), and the field named
NUL_BYTES = [
    ({"command": "echo a\0b"}, ["command", "line"]),
    ({"command": ["echo", "a\0b"]}, ["command", "argv", 1]),
    ({"command": ["ec\0ho"]}, ["command", "argv", 0]),
    ({"env": {"X": "a\0b"}}, ["env", "X"]),
    ({"env": {"X\0Y": "1"}}, ["env", "X\0Y", "[key]"]),
    ({"working_dir": "/tmp\0/x"}, ["working_dir"]),
    ({"name": "a\0b"}, ["name"]),
    ({"tenant": "vision\0"}, ["tenant"]),
]


@pytest.mark.parametrize(("fields", "loc"), NUL_BYTES)
def test_a_nul_byte_gets_422_naming_the_field(api, fields, loc):
    response = api.post("/v1/jobs", json={**SPEC, **fields}, headers=VISION)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", *loc]
    assert any(words in error["msg"] for words in ("NUL byte", "lowercase", "variable name"))


# numbers JSON (as Python reads it) lets through that no field can hold, and text no store can hold
UNREPRESENTABLE = [
    (b'{"command": "x", "resources": {"gpus": NaN}}', ["resources", "gpus"], "finite"),
    (b'{"command": "x", "resources": {"gpus": Infinity}}', ["resources", "gpus"], "finite"),
    (b'{"command": "x", "resources": {"cpus": 1e400}}', ["resources", "cpus"], "finite"),
    (b'{"command": "x", "resources": {"cpus": -Infinity}}', ["resources", "cpus"], "finite"),
    (b'{"command": "x", "resources": {"memory": NaN}}', ["resources", "memory"], "finite"),
    (b'{"command": "x", "resources": {"memory": 1e400}}', ["resources", "memory"], "finite"),
    (b'{"command": "x", "timeout": Infinity}', ["timeout"], "finite"),
    (b'{"command": "x", "timeout": NaN}', ["timeout"], "finite"),
    (b'{"command": "x", "replicas": 1e400}', ["replicas"], "finite"),
    (b'{"command": "\\ud800"}', ["command", "line"], "lone surrogate"),
    (b'{"command": ["x", "\\udfff"]}', ["command", "argv", 1], "lone surrogate"),
    (b'{"command": "x", "env": {"X": "\\ud800"}}', ["env", "X"], "lone surrogate"),
]


@pytest.mark.parametrize(("body", "loc", "words"), UNREPRESENTABLE)
def test_non_finite_numbers_and_lone_surrogates_get_422_not_500(api, body, loc, words):
    headers = {**VISION, "Content-Type": "application/json"}
    response = api.post("/v1/jobs", content=body, headers=headers)
    assert response.status_code == 422, response.text
    [error] = response.json()["detail"]
    assert error["loc"] == ["body", *loc] and words in error["msg"]
    assert api.get("/v1/jobs", headers=VISION).json()["items"] == []  # nothing queued


def test_a_refused_input_is_echoed_as_json_can_carry_it(api):
    headers = {**VISION, "Content-Type": "application/json"}
    nan = api.post("/v1/jobs", content=b'{"command": "x", "resources": {"gpus": NaN}}', headers=headers)
    assert nan.json()["detail"][0]["input"] == "nan"
    bad_key = api.post("/v1/jobs", content=b'{"command": "x", "env": {"\\ud800": "1"}}', headers=headers)
    assert bad_key.status_code == 422 and bad_key.json()["detail"][0]["loc"][:2] == ["body", "env"]


def test_missing_or_unknown_token_gets_401(api):
    assert api.post("/v1/jobs", json=SPEC).status_code == 401
    response = api.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401 and "unknown" in response.json()["detail"]


def test_oversized_body_gets_413(api):
    response = api.post("/v1/jobs", json={**SPEC, "env": {"X": "y" * 5000}}, headers=VISION)
    assert response.status_code == 413


def test_a_tenant_sees_and_cancels_only_its_own_jobs(api):
    mine = submit(api)
    theirs = submit(api, headers=NLP)
    listed = api.get("/v1/jobs", headers=VISION).json()["items"]
    assert [j["job_id"] for j in listed] == [mine["job_id"]]
    assert api.get(f"/v1/jobs/{theirs['job_id']}", headers=VISION).status_code == 404
    assert api.post(f"/v1/jobs/{theirs['job_id']}/cancel", headers=VISION).status_code == 404
    assert api.get("/v1/jobs", params={"tenant": "nlp"}, headers=VISION).status_code == 403
    everything = api.get("/v1/jobs", headers=ADMIN).json()["items"]
    assert {j["job_id"] for j in everything} == {mine["job_id"], theirs["job_id"]}


def test_submitting_for_another_tenant_needs_admin(api):
    assert api.post("/v1/jobs", json={**SPEC, "tenant": "nlp"}, headers=VISION).status_code == 403
    assert submit(api, headers=ADMIN, tenant="nlp")["tenant"] == "nlp"


def test_unknown_job_gets_404(api):
    assert api.get("/v1/jobs/doesnotexist", headers=VISION).status_code == 404
    assert api.get("/v1/jobs/doesnotexist/events", headers=VISION).status_code == 404


def test_a_unique_prefix_of_a_job_id_names_the_job_among_those_the_caller_sees(api, ctx):
    jobs = {"abcd0001aaaaaaaa": "vision", "abcd0002bbbbbbbb": "vision", "abce0003cccccccc": "nlp"}
    for job_id, tenant in jobs.items():
        submitted = JobSubmitted(
            job_id=job_id, name="n", tenant=tenant, user="u", spec=JobSpec(command="true")
        )
        asyncio.run(ctx.ledger.append(job_id, submitted))

    assert api.get("/v1/jobs/abcd0001", headers=VISION).json()["job_id"] == "abcd0001aaaaaaaa"
    ambiguous = api.get("/v1/jobs/abcd", headers=VISION)
    assert ambiguous.status_code == 409
    assert "abcd0001aaaaaaaa, abcd0002bbbbbbbb" in ambiguous.json()["detail"]
    assert api.get("/v1/jobs/abc", headers=VISION).status_code == 404  # shorter than MIN_PREFIX
    assert api.get("/v1/jobs/abce", headers=VISION).status_code == 404  # another tenant's: never seen
    assert api.get("/v1/jobs/abc", headers=NLP).status_code == 404
    assert api.get("/v1/jobs/abce", headers=NLP).json()["job_id"] == "abce0003cccccccc"
    assert api.get("/v1/jobs/abc%25", headers=ADMIN).status_code == 404  # (taken literally)
    assert api.get("/v1/jobs/abcd0", headers=ADMIN).status_code == 409

    events = api.get("/v1/jobs/abcd0002/events", headers=VISION).json()
    assert [e["event"]["subject"] for e in events] == ["abcd0002bbbbbbbb"]
    cancelled = api.post("/v1/jobs/abcd0002/cancel", headers=VISION).json()
    assert cancelled["job_id"] == "abcd0002bbbbbbbb" and cancelled["state"] == "cancelled"
    assert api.get("/v1/jobs/abcd0002bbbbbbbb", headers=VISION).json()["state"] == "cancelled"
    assert api.get("/v1/jobs/abcd0001/logs", headers=VISION).status_code == 200


def test_cancel_of_a_queued_job_cancels_it_and_a_second_cancel_is_409(api):
    job = submit(api)
    answer = api.post(f"/v1/jobs/{job['job_id']}/cancel", headers=VISION).json()
    assert answer["state"] == "cancelled"
    again = api.post(f"/v1/jobs/{job['job_id']}/cancel", headers=VISION)
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]


def test_cancel_of_a_running_job_is_a_request_for_the_executor(api, ctx):
    job_id = submit(api)["job_id"]
    placement = [ReplicaPlacement(replica=0, node="n1")]
    asyncio.run(ctx.ledger.append(job_id, JobPlaced(job_id=job_id, attempt=1, placements=placement)))
    asyncio.run(ctx.ledger.append(job_id, JobStarted(job_id=job_id, attempt=1, node="n1", replicas=[0])))
    answer = api.post(f"/v1/jobs/{job_id}/cancel", headers=VISION).json()
    assert answer["state"] == "running" and answer["cancel_requested"]
    types = [e["event"]["type"] for e in api.get(f"/v1/jobs/{job_id}/events", headers=VISION).json()]
    assert types[-1] == "io.gpuyard.job.cancel_requested"


def test_idempotency_key_submits_once(api):
    headers = {**VISION, "Idempotency-Key": "k-1"}
    first = api.post("/v1/jobs", json=SPEC, headers=headers).json()
    second = api.post("/v1/jobs", json=SPEC, headers=headers).json()
    assert first["job_id"] == second["job_id"] and second["duplicate"] and not first["duplicate"]
    assert len(api.get("/v1/jobs", headers=VISION).json()["items"]) == 1


def test_list_filters_by_state_and_paginates_newest_first(api):
    ids = [submit(api, name=f"j{i}")["job_id"] for i in range(5)]
    api.post(f"/v1/jobs/{ids[0]}/cancel", headers=VISION)
    page = api.get("/v1/jobs", params={"limit": 2}, headers=VISION).json()
    assert [j["job_id"] for j in page["items"]] == [ids[4], ids[3]]
    rest = api.get("/v1/jobs", params={"limit": 10, "cursor": page["next_cursor"]}, headers=VISION).json()
    assert [j["job_id"] for j in rest["items"]] == [ids[2], ids[1], ids[0]] and rest["next_cursor"] is None
    cancelled = api.get("/v1/jobs", params={"state": "cancelled"}, headers=VISION).json()["items"]
    assert [j["job_id"] for j in cancelled] == [ids[0]]
    assert api.get("/v1/jobs", params={"state": "sleeping"}, headers=VISION).status_code == 422
    refused = api.get("/v1/jobs", params={"cursor": "garbage!"}, headers=VISION)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "cursor"]


def test_logs_are_read_from_the_log_store(api, ctx):
    job_id = submit(api)["job_id"]
    output = "".join(f"line {i}\n" for i in range(10)).encode()
    asyncio.run(ctx.logs.append(split(LogKey(job_id, 1, 0), 0, output)))
    assert api.get(f"/v1/jobs/{job_id}/logs", headers=VISION).content == output
    assert api.get(f"/v1/jobs/{job_id}/logs", params={"tail": 2}, headers=VISION).text == "line 8\nline 9\n"
    assert api.get(f"/v1/jobs/{job_id}/logs", params={"replica": 3}, headers=VISION).status_code == 404
    assert api.get(f"/v1/jobs/{job_id}/logs", headers=NLP).status_code == 404  # another tenant's job


@pytest.mark.parametrize(
    ("range_", "body", "content_range"),
    [
        ("bytes=0-6", b"line 0\n", "bytes 0-6/70"),
        ("bytes=63-", b"line 9\n", "bytes 63-69/70"),
        ("bytes=-14", b"line 8\nline 9\n", "bytes 56-69/70"),
        ("bytes=60-1000", b" 8\nline 9\n", "bytes 60-69/70"),  # the last byte is cut to the end
    ],
)
def test_logs_answer_byte_ranges(api, ctx, range_, body, content_range):
    job_id = submit(api)["job_id"]
    output = "".join(f"line {i}\n" for i in range(10)).encode()
    asyncio.run(ctx.logs.append(split(LogKey(job_id, 1, 0), 0, output)))
    answer = api.get(f"/v1/jobs/{job_id}/logs", headers={**VISION, "Range": range_})
    assert answer.status_code == 206
    assert answer.headers["content-range"] == content_range and answer.content == body


def test_a_range_outside_the_output_is_416_and_a_bad_one_400(api, ctx):
    job_id = submit(api)["job_id"]
    asyncio.run(ctx.logs.append(split(LogKey(job_id, 1, 0), 0, b"short\n")))
    outside = api.get(f"/v1/jobs/{job_id}/logs", headers={**VISION, "Range": "bytes=100-"})
    assert outside.status_code == 416 and outside.headers["content-range"] == "bytes */6"
    for bad in ("lines=0-1", "bytes=a-b", "bytes=0-1,4-5", "bytes=-"):
        assert api.get(f"/v1/jobs/{job_id}/logs", headers={**VISION, "Range": bad}).status_code == 400, bad


def test_openapi_is_served(api):
    schema = api.get("/openapi.json").json()
    assert "/v1/jobs" in schema["paths"] and "/v1/events/stream" in schema["paths"]
    assert api.get("/docs").status_code == 200


def operations(schema: dict):
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            yield path, method, operation


# what each route can answer besides its success, beyond 400 and 413 (every route: the body limit)
ERRORS = {
    ("/v1/jobs", "post"): {401, 403, 404, 409, 422, 429, 503},
    ("/v1/jobs", "get"): {401, 403, 422, 503},
    ("/v1/jobs/validate", "post"): {401, 403, 404, 422, 503},
    ("/v1/tenants", "get"): {401, 503},
    ("/v1/jobs/{job_id}", "get"): {401, 404, 422, 503},
    ("/v1/jobs/{job_id}/events", "get"): {401, 404, 422, 503},
    ("/v1/jobs/{job_id}/why", "get"): {401, 404, 409, 422, 503},
    ("/v1/jobs/{job_id}/cancel", "post"): {401, 404, 409, 422, 503},
    ("/v1/jobs/{job_id}/logs", "get"): {206, 401, 404, 416, 422, 503},
    ("/v1/jobs/{job_id}/checkpoints", "post"): {401, 403, 404, 409, 422, 429, 503},
    ("/v1/jobs/{job_id}/artifacts", "get"): {401, 404, 409, 422, 503},
    ("/v1/jobs/{job_id}/artifacts/content", "get"): {401, 404, 409, 422, 503},
    ("/v1/events/stream", "get"): {401, 422, 503},
    ("/v1/deadletters", "get"): {401, 403, 422, 503},
    ("/v1/nodes", "get"): {401},
    ("/v1/nodes/{node}/cordon", "post"): {401, 403, 404, 422},
    ("/v1/nodes/{node}/drain", "post"): {401, 403, 404, 422},
    ("/v1/nodes/{node}/uncordon", "post"): {401, 403, 404, 422},
    ("/v1/services", "get"): {401},
    ("/v1/admin/tokens", "post"): {401, 403, 409, 422},
    ("/v1/admin/tokens", "get"): {401, 403},
    ("/v1/admin/tokens/{token_id}", "delete"): {401, 403, 404, 409, 422},
    ("/v1/models", "post"): {200, 401, 403, 409, 422, 429, 503},
    ("/v1/models", "get"): {401, 422, 503},
    ("/v1/models/{name}", "get"): {401, 404, 422, 503},
    ("/v1/models/{name}", "patch"): {401, 403, 404, 422, 503},
    ("/v1/models/{name}", "delete"): {401, 403, 404, 409, 422, 503},
    ("/v1/models/{name}/versions/{version}", "get"): {401, 404, 422, 503},
    ("/v1/models/{name}/versions/{version}", "delete"): {401, 403, 404, 409, 422, 503},
    ("/v1/models/{name}/deployments", "post"): {401, 403, 404, 409, 422, 429, 503},
    ("/v1/models/{name}/deployments", "get"): {401, 404, 422, 503},
    ("/v1/models/{name}/deployments", "delete"): {401, 404, 409, 422, 503},
    ("/v1/alerts", "get"): {401, 403, 422, 503},
    ("/v1/usage", "get"): {401, 403, 422, 503},
    ("/v1/gpus/history", "get"): {401, 422, 503},
    ("/v1/jobs/{job_id}/gpu", "get"): {401, 404, 409, 422, 503},
    ("/v1/volumes", "post"): {401, 403, 409, 422, 503},
    ("/v1/volumes", "get"): {401, 403, 422, 503},
    ("/v1/volumes/{name}", "get"): {401, 404, 422, 503},
    ("/v1/volumes/{name}", "delete"): {401, 404, 409, 422, 503},
    ("/v1/volumes/{name}/files", "get"): {401, 404, 422, 503},
    ("/v1/volumes/{name}/content", "get"): {401, 404, 422, 503},
    ("/v1/volumes/{name}/content", "put"): {401, 404, 413, 422, 429, 503},
    ("/v1/volumes/{name}/content", "delete"): {401, 404, 422, 503},
    ("/v1/environments", "get"): {401, 422},
    ("/v1/environments/{key}", "delete"): {401, 403, 404, 409, 422, 503},
    ("/healthz", "get"): set(),
    ("/v1/jobs/{job_id}/exec", "get"): {401, 404, 409, 422, 426, 503},  # (426: a WebSocket, docs/access.md)
    ("/v1/dev", "post"): {401, 403, 404, 409, 422, 429, 503},
    ("/v1/dev", "get"): {401},
    ("/v1/dev/{job_id}", "get"): {401, 404, 409, 422},
    ("/v1/dev/{job_id}", "delete"): {401, 404, 409, 422},
    **{
        ("/dev/{job_id}/{path}", method): {401, 403, 404, 409, 422, 503}
        for method in ("get", "post", "put", "patch", "delete", "options")
    },
    # a running job's port, through its node's gateway (docs/access.md): every method the job's server takes
    **{
        (path, method): {401, 404, 409, 422, 503}
        for path in (
            "/jobs/{job_id}/ports/{port}/{path}",
            "/jobs/{job_id}/replicas/{replica}/ports/{port}/{path}",
        )
        for method in ("get", "post", "put", "patch", "delete", "options")
    },
}


def test_every_route_documents_each_status_it_answers(api):
    schema = api.get("/openapi.json").json()
    routes = {(path, method): operation for path, method, operation in operations(schema)}
    assert set(routes) == set(ERRORS)
    for (path, method), operation in routes.items():
        documented = {int(code) for code in operation["responses"]}
        assert ERRORS[path, method] | {400, 413} <= documented, (path, method)
        for code in documented - {422} - {c for c in documented if c < 300}:
            [content] = operation["responses"][str(code)][
                "content"
            ].values()  # (text/plain on logs: FastAPI's)
            assert content["schema"] == {"$ref": "#/components/schemas/ErrorOut"}, (path, method, code)
        # and what it answers to a request without a token, with another tenant's, with a body over the limit
        url = path.replace("{job_id}", "no-such-job").replace("{token_id}", "no-such-token")
        url = url.replace("{name}", "no-such-model").replace("{version}", "1").replace("{node}", "node-1")
        for headers, body in ((None, None), (VISION, None), (VISION, b"x" * 5000)):
            answer = api.request(method.upper(), url, headers=headers, content=body).status_code
            assert answer < 300 or answer in documented, (path, method, answer)


# What the other tenant's token (vision's) gets from each route when it names tenant nlp's job, token or data.
# Every route of the document must be here: a new route joins, and states how it keeps tenants apart.
NOT_YOURS = {
    ("/v1/jobs", "post"): 403,  # a spec for tenant nlp
    ("/v1/jobs", "get"): 403,  # ?tenant=nlp (and its own list holds none of nlp's: checked below)
    ("/v1/jobs/validate", "post"): 403,  # a spec for tenant nlp
    ("/v1/tenants", "get"): 200,  # its own row only (tests/unit/services/submit/test_dashboard_api.py)
    ("/v1/jobs/{job_id}", "get"): 404,
    ("/v1/jobs/{job_id}/events", "get"): 404,
    ("/v1/jobs/{job_id}/why", "get"): 404,
    ("/v1/jobs/{job_id}/cancel", "post"): 404,
    ("/v1/jobs/{job_id}/logs", "get"): 404,
    # the job's own checkpoint token only: a person's token is refused whoever's job it names (another job's
    # checkpoint token is answered 404: tests/unit/services/submit/test_checkpoint_reports.py)
    ("/v1/jobs/{job_id}/checkpoints", "post"): 403,
    ("/v1/jobs/{job_id}/artifacts", "get"): 404,  # nlp's job keeps an output file (secret.txt): never read
    ("/v1/jobs/{job_id}/artifacts/content", "get"): 404,
    ("/v1/events/stream", "get"): None,  # needs the bus: tests/integration/test_platform.py walks it
    ("/v1/deadletters", "get"): 403,  # admins only (events of every tenant)
    ("/v1/nodes", "get"): 200,  # the cluster's machines: no tenant's data
    ("/v1/nodes/{node}/cordon", "post"): 403,  # admins only (every tenant's jobs run there)
    ("/v1/nodes/{node}/drain", "post"): 403,
    ("/v1/nodes/{node}/uncordon", "post"): 403,
    ("/v1/services", "get"): 200,  # the platform's processes: no tenant's data
    ("/v1/admin/tokens", "post"): 403,
    ("/v1/admin/tokens", "get"): 403,
    ("/v1/admin/tokens/{token_id}", "delete"): 403,
    ("/v1/models", "post"): 403,  # ?tenant=nlp: publishing for another tenant
    ("/v1/models", "get"): 200,  # ?tenant=nlp: only nlp's public models (none): checked below
    ("/v1/models/{name}", "get"): 404,  # nlp's private model is as if it did not exist
    ("/v1/models/{name}", "patch"): 404,
    ("/v1/models/{name}", "delete"): 404,
    ("/v1/models/{name}/versions/{version}", "get"): 404,
    ("/v1/models/{name}/versions/{version}", "delete"): 404,
    ("/v1/models/{name}/deployments", "post"): 404,  # a private model of nlp's is not deployable
    ("/v1/models/{name}/deployments", "get"): 404,
    ("/v1/models/{name}/deployments", "delete"): 404,
    (
        "/v1/alerts",
        "get",
    ): 403,  # ?tenant=nlp (and its own list holds none of nlp's: tests/unit/services/monitor)
    (
        "/v1/usage",
        "get",
    ): 403,  # ?tenant=nlp (and its own usage holds none of nlp's: tests/unit/shared/reporting/test_usage_api.py)
    ("/v1/gpus/history", "get"): 200,  # the node's GPUs, nlp's job on them only as `other`
    ("/v1/jobs/{job_id}/gpu", "get"): 404,
    # ?tenant=nlp on each: nlp's volume is as if it did not exist, its list and a volume made for it refused
    ("/v1/volumes", "post"): 403,
    ("/v1/volumes", "get"): 403,
    ("/v1/volumes/{name}", "get"): 404,
    ("/v1/volumes/{name}", "delete"): 404,
    ("/v1/volumes/{name}/files", "get"): 404,
    ("/v1/volumes/{name}/content", "get"): 404,
    ("/v1/volumes/{name}/content", "put"): 404,
    ("/v1/volumes/{name}/content", "delete"): 404,
    # every tenant sees the nodes' job environments (shared by content: keys, sizes, package names); only an
    # admin removes one
    ("/v1/environments", "get"): 200,
    ("/v1/environments/{key}", "delete"): 403,
    ("/healthz", "get"): 200,
    ("/v1/jobs/{job_id}/exec", "get"): 404,  # (and its WebSocket upgrade: test_access_routes, test_access)
    # a dev environment of its own tenant; nlp's job, a dev environment or not, is none of its own (another
    # tenant's dev environment is 403 on HTTP and on the WebSocket upgrade: test_dev_routes, test_dev)
    ("/v1/dev", "post"): 422,  # (no body here: a body starts one for its own tenant, test_dev_routes)
    ("/v1/dev", "get"): 200,
    ("/v1/dev/{job_id}", "get"): 404,
    ("/v1/dev/{job_id}", "delete"): 404,
    **{
        ("/dev/{job_id}/{path}", method): 404
        for method in ("get", "post", "put", "patch", "delete", "options")
    },
    # nlp's job is as if it did not exist, whatever the method (its WebSocket upgrades, and exec's: test_access)
    **{
        (path, method): 404
        for path in (
            "/jobs/{job_id}/ports/{port}/{path}",
            "/jobs/{job_id}/replicas/{replica}/ports/{port}/{path}",
        )
        for method in ("get", "post", "put", "patch", "delete", "options")
    },
}
THEIR_MODEL = "nlp-private"
THEIR_VOLUME = "nlp-data"
SPEC_ROUTES = {("/v1/jobs", "post"), ("/v1/jobs/validate", "post")}


def test_every_route_keeps_another_tenants_jobs_and_tokens_from_a_tenant(api, ctx, tmp_path):
    theirs = submit(api, headers=NLP)["job_id"]
    asyncio.run(ctx.logs.append(split(LogKey(theirs, 1, 0), 0, b"nlp's secret output\n")))
    asyncio.run(held_gpu_sample(ctx, theirs, "nlp", "node-1"))
    kept_by_them = tmp_path / "storage" / "outputs" / "nlp" / theirs
    kept_by_them.mkdir(parents=True)
    (kept_by_them / "secret.txt").write_bytes(b"secret")
    token_id = next(e.id for e in ctx.tokens.entries() if e.tenant == "nlp")
    schema = api.get("/openapi.json").json()
    assert {(path, method) for path, method, _ in operations(schema)} == set(NOT_YOURS)
    published = api.post(
        "/v1/models", params={"name": THEIR_MODEL}, content=tiny_model(), headers=NLP
    )  # private: nlp's only
    assert published.status_code == 201, published.text
    made = api.post("/v1/volumes", json={"name": THEIR_VOLUME, "size": 1000}, headers=NLP)
    assert made.status_code == 201, made.text
    written = api.put(f"/v1/volumes/{THEIR_VOLUME}/content", params={"path": "secret.txt"}, content=b"secret")
    assert written.status_code == 401  # (no token)
    written = api.put(
        f"/v1/volumes/{THEIR_VOLUME}/content", params={"path": "secret.txt"}, content=b"secret", headers=NLP
    )
    assert written.status_code == 201, written.text
    for (path, method), expected in NOT_YOURS.items():
        if expected is None:
            continue
        url = path.replace("{job_id}", theirs).replace("{token_id}", token_id)
        name = THEIR_VOLUME if path.startswith("/v1/volumes") else THEIR_MODEL
        url = url.replace("{name}", name).replace("{version}", "1").replace("{node}", "node-1")
        url = url.replace("{port}", "6006").replace("{replica}", "0").replace("{path}", "")
        body = {**SPEC, "tenant": "nlp"} if (path, method) in SPEC_ROUTES else None
        body = {"public": True} if method == "patch" else body
        tenant_param = (path, method) in (("/v1/jobs", "get"), ("/v1/alerts", "get"), ("/v1/usage", "get"))
        params = {"tenant": "nlp"} if tenant_param or "/models" in path or "/volumes" in path else None
        params = {"node": "node-1"} if path == "/v1/gpus/history" else params
        if path.endswith("/content"):
            params = {**(params or {}), "path": "secret.txt"}  # (a volume's file; nlp's job's kept one)
        body = {"name": "mine", "size": 10} if (path, method) == ("/v1/volumes", "post") else body
        if (path, method) == ("/v1/models", "post"):
            params = {"name": "mine", "tenant": "nlp"}
            answer = api.post(url, params=params, content=tiny_model(), headers=VISION)
        elif (path, method) == ("/v1/volumes/{name}/content", "put"):
            answer = api.put(url, params=params, content=b"overwritten", headers=VISION)
        else:
            answer = api.request(method.upper(), url, headers=VISION, json=body, params=params)
        assert answer.status_code == expected, (path, method, answer.status_code, answer.text[:200])
        assert theirs not in answer.text or answer.status_code >= 400 and "no job" in answer.text
        assert "secret" not in answer.text
        assert THEIR_MODEL not in answer.text or answer.status_code == 404 and "no model" in answer.text
    assert theirs not in api.get("/v1/jobs", headers=VISION).text
    assert [t["tenant"] for t in api.get("/v1/tenants", headers=VISION).json()["items"]] == ["vision"]
    assert api.get(f"/v1/jobs/{theirs}/logs", headers=NLP).text == "nlp's secret output\n"  # it is there
    assert THEIR_MODEL not in api.get("/v1/models", headers=VISION).text
    assert (
        api.get(f"/v1/models/{THEIR_MODEL}", headers=NLP).json()["versions"][0]["version"] == 1
    )  # it is there
    assert api.get("/v1/models/mine", params={"tenant": "nlp"}, headers=ADMIN).status_code == 404
    assert THEIR_VOLUME not in api.get("/v1/volumes", headers=VISION).text
    kept = api.get(f"/v1/volumes/{THEIR_VOLUME}/content", params={"path": "secret.txt"}, headers=NLP)
    assert kept.content == b"secret"  # it is there, untouched
    output = api.get(f"/v1/jobs/{theirs}/artifacts/content", params={"path": "secret.txt"}, headers=NLP)
    assert output.content == b"secret"  # it is there, for nlp
    assert api.get(f"/v1/jobs/{theirs}/artifacts", headers=ADMIN).json()["items"][0]["path"] == "secret.txt"
    assert (
        api.get("/v1/volumes", params={"tenant": "nlp"}, headers=ADMIN).json()["items"][0]["name"]
        == THEIR_VOLUME
    )


async def held_gpu_sample(ctx, job_id: str, tenant: str, node: str) -> None:
    """One sample in the GPU history of a GPU of `node` held by `job_id`."""
    reading = GpuReading(
        index=0,
        uuid="GPU-0",
        utilization_pct=80.0,
        memory_used_bytes=1 << 30,
        holders=[GpuHolder(job_id=job_id, tenant=tenant, user="secret-user")],
    )
    history = await GpuHistory.open(history_path_beside(ctx.store.path))
    await history.add([GpuPoint.raw(node, reading, time.time() - 5, 1.0)])
    await history.close()


def test_the_schema_of_a_spec_refuses_what_the_api_refuses(api):
    """The rules are the model's, and the schema carries them: what the schema refuses, the API refuses."""
    spec = api.get("/openapi.json").json()["components"]["schemas"]["JobSpec"]["properties"]
    [command, null] = spec["command"]["anyOf"]  # (none: a serve job's)
    assert null == {"type": "null"}
    line, argv = command["oneOf"]
    assert argv["minItems"] == 1 and argv["prefixItems"] == [{"type": "string", "minLength": 1}]
    [env_name] = spec["env"]["patternProperties"]
    assert spec["env"]["additionalProperties"] is False
    name = next(s for s in spec["name"]["anyOf"] if s.get("type") == "string")["pattern"]
    refused = [  # (a field, a schema pattern it breaks)
        ({"command": ""}, line["pattern"]),
        ({"command": "   "}, line["pattern"]),
        ({"command": "a\0b"}, line["pattern"]),
        ({"command": ["x", "a\0b"]}, argv["items"]["pattern"]),
        ({"name": "Bad_Name"}, name),
        ({"name": "-x"}, name),
        ({"name": "a" * 64}, name),
        ({"env": {"1X": "y"}}, env_name),
        ({"env": {"A-B": "y"}}, env_name),
    ]
    for fields, pattern in refused:
        [value] = fields.values()
        text = (
            next(iter(value)) if isinstance(value, dict) else value[-1] if isinstance(value, list) else value
        )
        assert re.fullmatch(pattern.strip("^$"), text) is None, (fields, pattern)
        assert api.post("/v1/jobs", json={**SPEC, **fields}, headers=VISION).status_code == 422, fields
    for fields in ({"command": ["x", ""]}, {"name": "a-1"}, {"env": {"_A1": "y\n"}}):  # accepted by both
        assert api.post("/v1/jobs", json={**SPEC, **fields}, headers=VISION).status_code == 202, fields


INTERNAL_FIELDS = {"version", "exits", "log_tail", "preempt_requested", "failure_reason"}


def schema_properties(schema: dict, root: dict, seen: set[str] | None = None) -> set[str]:
    """Every property name in a schema and in the schemas it refers to, however deep."""
    seen = set() if seen is None else seen
    names: set[str] = set()
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if ref and ref not in seen:
            seen.add(ref)
            names |= schema_properties(root["components"]["schemas"][ref.rsplit("/", 1)[1]], root, seen)
        names |= set(schema.get("properties", {}))
        for value in schema.values():
            names |= schema_properties(value, root, seen)
    elif isinstance(schema, list):
        for value in schema:
            names |= schema_properties(value, root, seen)
    return names


def test_the_job_answers_schema_shows_no_internal_field(api):
    schema = api.get("/openapi.json").json()
    paths = schema["paths"]
    responses = [paths["/v1/jobs"]["get"]["responses"], paths["/v1/jobs/{job_id}"]["get"]["responses"]]
    serve = "#/components/schemas/ServeSpec"  # the spec as submitted: its `version` is the model's, not the store's
    assert set(schema["components"]["schemas"]["ServeSpec"]["properties"]) == {"model", "version", "tenant"}
    names = schema_properties(responses, schema, seen={serve})
    assert {"job_id", "pending", "failure", "preemption", "attempts", "placements", "code"} <= names
    assert not names & INTERNAL_FIELDS
    assert schema["components"]["schemas"]["PendingOut"]["properties"]["code"] == {
        "$ref": "#/components/schemas/PendingCode",
        "description": "The reason, from a closed set of codes.",
    }


def record(ctx, job_id: str, *events) -> None:
    for data in events:
        asyncio.run(ctx.ledger.append(job_id, data))


def test_a_waiting_job_shows_its_pending_reason_and_nothing_internal(api, ctx):
    job_id = submit(api)["job_id"]
    reason = PendingReason(code="insufficient_gpus", message="needs 1 GPU", position=2)
    record(ctx, job_id, JobPending(job_id=job_id, attempt=1, reason=reason))
    job = api.get(f"/v1/jobs/{job_id}", headers=VISION).json()
    assert job["pending"] == {
        "code": "insufficient_gpus",
        "message": "needs 1 GPU",
        "details": {},
        "position": 2,
        "estimated_start": None,
    }
    assert not set(job) & INTERNAL_FIELDS
    listed = api.get("/v1/jobs", headers=VISION).json()["items"]
    assert listed == [job]


def test_a_waiting_job_is_told_its_place_in_line_now_from_the_queues_line(api, ctx):
    first, second, never = (submit(api)["job_id"] for _ in range(3))
    start = datetime.now(UTC) + timedelta(minutes=30)
    for job_id, position, start_at in ((first, 1, None), (second, 2, start), (never, None, None)):
        text = "needs 1 GPU" if position else "needs 9 GPUs on one node; the largest node has 8"
        rendered = waiting_message(text, position, None)
        reason = PendingReason(
            code="insufficient_gpus" if position else "too_large",
            message=rendered, text=text, position=position, estimated_start=start_at,
        )  # fmt: skip
        record(ctx, job_id, JobPending(job_id=job_id, attempt=1, reason=reason))

    def pending(job_id: str) -> dict:
        return api.get(f"/v1/jobs/{job_id}", headers=VISION).json()["pending"]

    assert (pending(second)["position"], pending(second)["message"]) == (2, "needs 1 GPU; 2nd in line")
    # the scheduler stores its line: `first` was placed, `second` moved up with no reason of its own written
    asyncio.run(ctx.store.put_document(LINE_KEY, line_doc([second])))
    ctx.line.read_at = -READ_SECONDS  # (read again at the next question)
    now = pending(second)
    assert now["position"] == 1 and now["message"].startswith(
        "needs 1 GPU; 1st in line; estimated start in about"
    )
    assert (pending(first)["position"], pending(never)["position"]) == (1, None)  # not in the line: as stored
    listed = {
        j["job_id"]: j["pending"]["position"] for j in api.get("/v1/jobs", headers=VISION).json()["items"]
    }
    assert listed == {first: 1, second: 1, never: None}
    assert "1st in line" in api.get(f"/v1/jobs/{second}/why", headers=VISION).text


def test_a_failed_job_shows_reason_message_exit_code_and_replica_not_raw_exits(api, ctx):
    job_id = submit(api, replicas=2)["job_id"]
    placements = [
        ReplicaPlacement(replica=r, node="n1", gpus=[GpuShare(index=r, uuid="GPU-x")]) for r in (0, 1)
    ]
    record(
        ctx,
        job_id,
        JobPlaced(job_id=job_id, attempt=1, placements=placements),
        JobStarted(job_id=job_id, attempt=1, node="n1", replicas=[0, 1]),
        JobReplicaExited(job_id=job_id, attempt=1, node="n1", replica=0, exit_code=0),
        JobReplicaExited(
            job_id=job_id, attempt=1, node="n1", replica=1, exit_code=3, reason=FailureReason.EXIT_CODE,
            message="exited with 3", log_tail=["boom"],
        ),
        JobFailed(
            job_id=job_id, attempt=1, reason=FailureReason.EXIT_CODE, exit_code=3, message="exited with 3",
            log_tail=["boom"],
        ),
    )  # fmt: skip
    job = api.get(f"/v1/jobs/{job_id}", headers=VISION).json()
    assert job["state"] == "failed"
    assert job["failure"] == {
        "reason": "exit_code",
        "message": "exited with 3",
        "exit_code": 3,
        "signal": None,
        "replica": 1,
    }
    assert job["placements"][1]["gpus"] == [{"index": 1, "fraction": 1.0, "memory_bytes": None}]
    assert (job["attempts"][0]["outcome"], job["attempts"][0]["failure"]) == (
        "failed",
        "exit_code",
    ) and "started" not in job["attempts"][0]
    assert not set(job) & INTERNAL_FIELDS


def test_a_job_being_preempted_says_why_by_whom_and_the_grace(api, ctx):
    job_id = submit(api)["job_id"]
    record(
        ctx,
        job_id,
        JobPlaced(job_id=job_id, attempt=1, placements=[ReplicaPlacement(replica=0, node="n1")]),
        JobStarted(job_id=job_id, attempt=1, node="n1", replicas=[0]),
        JobPreempted(
            job_id=job_id,
            attempt=1,
            cause=PreemptionCause.PRIORITY,
            by_job="urgent",
            grace_seconds=15,
            lost_work_seconds=754.5,
        ),
    )
    job = api.get(f"/v1/jobs/{job_id}", headers=VISION).json()
    assert job["preemption"] == {
        "cause": "priority",
        "node": None,
        "reason": preemption_text(PreemptionCause.PRIORITY),
        "by_job": "urgent",
        "grace_seconds": 15,
        "lost_work_seconds": 754.5,
    }
    assert job["failure"] is None and job["pending"] is None


def test_nodes_and_health_answer_their_public_models(api, ctx):
    assert api.get("/healthz").json() == {"status": "ok", "service": "submit"}
    assert api.get("/v1/nodes", headers=VISION).json() == []
    assert api.get("/v1/nodes").status_code == 401


def test_the_service_refuses_a_public_address_without_tokens(tmp_path):
    import subprocess
    import sys

    env = {
        "PATH": "/usr/bin:/bin",
        "GPUYARD_DATA_DIR": str(tmp_path),
        "GPUYARD_NATS_URL": "nats://127.0.0.1:1",
    }
    result = subprocess.run(
        [sys.executable, "-m", "gpuyard.services.submit", "--submit-host", "0.0.0.0"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "no tokens configured and 0.0.0.0 is not loopback" in result.stderr


def test_telemetry_forgets_service_instances_silent_for_a_day(monkeypatch):
    import time as clock

    from gpuyard.services.submit import telemetry
    from gpuyard.shared.contracts.events.envelope import make_event
    from gpuyard.shared.contracts.events.services import ServiceHeartbeat

    def beat(instance: str):
        data = ServiceHeartbeat(
            service="executor", instance=instance, pid=1, host="h", started_at=clock.time(), version="0"
        )
        return make_event(data, source="/test")

    seen = telemetry.Telemetry()
    now = 1_800_000_000.0
    monkeypatch.setattr(telemetry.time, "time", lambda: now)
    seen.observe(beat("h-1"))  # an instance that restarted as h-2 a moment later
    now += telemetry.FORGET_SERVICE_AFTER + 61
    seen.observe(beat("h-2"))
    assert list(seen.services) == ["h-2"]


def test_services_answer_a_crash_looping_process_with_its_restarts_and_last_error(api, ctx):
    from gpuyard.shared.contracts.events.envelope import make_event
    from gpuyard.shared.contracts.events.services import ProcessState, ServiceStatus

    looping = ServiceStatus(
        service="serving",
        process="serving",
        host="h",
        pid=41,
        state=ProcessState.CRASH_LOOPING,
        restarts=3,
        exit_code=1,
        last_error="RuntimeError: no model store",
        version="1.0",
    )
    ctx.telemetry.observe(make_event(looping, source="/gpuyard/supervisor/h"))
    [row] = api.get("/v1/services", headers=VISION).json()
    assert row["service"] == "serving" and row["instance"] == "h-41" and row["pid"] == 41
    assert (row["state"], row["restarts"], row["exit_code"]) == ("crash_looping", 3, 1)
    assert row["last_error"] == "RuntimeError: no model store"
    assert api.get("/v1/services").status_code == 401
