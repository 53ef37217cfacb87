"""Publishing models: the signature read from the ONNX graph, the model store (immutable,
atomic, checked on every load), jobs' publish tokens, /v1/models with tenants kept apart, the executor's
token in a replica's environment, and the CLI."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import time
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from gpuyard import cli
from gpuyard.client import Client
from gpuyard.services.executor import jobenv
from gpuyard.services.submit.app import create_app
from gpuyard.shared.auth.jobtokens import JobTokenError, ensure_secret, sign, verify
from gpuyard.shared.contracts.events.jobs import (
    JobPlaced,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.modelfiles.signature import InvalidModel, read_signature
from gpuyard.shared.modelfiles.store import (
    ChecksumMismatch,
    ModelStore,
    ModelStoreError,
    load,
    load_to,
    sha256_of,
)
from gpuyard.shared.stores.readmodels.modelregistry import stream_id
from tests.unit.services.submit.onnxmodels import tiny_model
from tests.unit.services.submit.submitctx import submit_context

VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}
ADMIN = {"Authorization": "Bearer tok-admin"}
TOKENS = {
    "tok-vision": {"tenant": "vision", "user": "ana"},
    "tok-nlp": {"tenant": "nlp", "user": "bo"},
    "tok-admin": {"tenant": "ops", "user": "root", "admin": True},
}


# ---------------------------------------------------------------- the signature


def test_the_signature_is_read_from_the_graph_with_v2_datatypes_and_dynamic_dims():
    sig = read_signature(tiny_model())
    assert [(t.name, t.datatype, t.shape) for t in sig.inputs] == [
        ("x", "FP32", [-1, 3]),
        ("ids", "INT64", [-1]),
    ]
    assert [(t.name, t.datatype, t.shape) for t in sig.outputs] == [
        ("y", "FP32", [-1, 3]),
        ("ids_out", "INT64", [-1]),
        ("positive", "BOOL", [-1, 3]),
    ]


def test_initializers_listed_as_inputs_are_not_inputs():
    assert [t.name for t in read_signature(tiny_model(initializer_as_input=True)).inputs] == ["x", "ids"]


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "empty"),
        (b"\xff\xfe not a protobuf at all \x00\x01", "not"),
        (b"just some text that happens to parse", "not"),
    ],
)
def test_a_file_that_is_not_an_onnx_model_is_refused_with_the_reason(data, words):
    with pytest.raises(InvalidModel, match=words):
        read_signature(data)


def test_a_model_with_external_data_is_refused():
    import onnx

    model = onnx.load_model_from_string(tiny_model())
    tensor = model.graph.initializer[0]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    entry = tensor.external_data.add()
    entry.key, entry.value = "location", "weights.bin"
    with pytest.raises(InvalidModel, match="external data"):
        read_signature(model.SerializeToString())


# ---------------------------------------------------------------- the model store


def test_the_store_writes_atomically_under_tenant_name_version_and_loads_checked(tmp_path):
    store = ModelStore(str(tmp_path / "models"))
    data = tiny_model()
    uri, sha = store.put("vision", "mnist", 1, data)
    assert sha == sha256_of(data)
    assert uri == str(tmp_path / "models" / "vision" / "mnist" / "1" / f"{sha}.onnx")
    assert load(uri, sha) == data
    assert [p.name for p in Path(uri).parent.iterdir()] == [f"{sha}.onnx"]  # no temporary left
    assert not stat.S_IMODE(os.stat(uri).st_mode) & 0o277  # read-only, the platform's own
    assert store.put("vision", "mnist", 1, data) == (uri, sha)  # the same bytes again: the same file
    assert load_to(uri, sha, tmp_path / "cache") == Path(uri)


def test_a_changed_file_is_refused_on_load(tmp_path):
    store = ModelStore(str(tmp_path))
    uri, sha = store.put("vision", "mnist", 1, tiny_model())
    os.chmod(uri, 0o600)
    Path(uri).write_bytes(tiny_model(3.0))
    with pytest.raises(ChecksumMismatch, match="changed or damaged"):
        load(uri, sha)
    with pytest.raises(ChecksumMismatch):
        load_to(uri, sha, tmp_path / "cache")
    Path(uri).unlink()
    with pytest.raises(ModelStoreError, match="missing"):
        load(uri, sha)


def test_an_fsspec_url_is_a_store(tmp_path):
    store = ModelStore("memory://gpuyard-test/models")
    uri, sha = store.put("vision", "mnist", 2, b"bytes")
    assert uri == f"memory://gpuyard-test/models/vision/mnist/2/{sha}.onnx" and load(uri, sha) == b"bytes"
    assert load_to(uri, sha, tmp_path).read_bytes() == b"bytes"
    store.delete(uri)
    with pytest.raises(ModelStoreError, match="missing"):
        load(uri, sha)
    # (without s3fs, an s3:// store says what to install: tests/contract/test_model_store.py)


def test_names_that_could_leave_the_store_are_refused(tmp_path):
    store = ModelStore(str(tmp_path))
    for tenant, name in (("..", "x"), ("vision", "../etc"), ("vision", "a/b")):
        with pytest.raises(ModelStoreError):
            store.put(tenant, name, 1, b"x")
    with pytest.raises(ModelStoreError, match="not in the model store"):
        store.delete("/etc/passwd")


# ---------------------------------------------------------------- jobs' publish tokens

SECRET = b"s" * 40


def test_a_job_token_carries_tenant_job_attempt_and_scope_and_expires():
    token = sign(SECRET, tenant="vision", job_id="abc", attempt=2, lifetime=60, now=1000)
    claims = verify(SECRET, token, now=1059)
    assert (claims.tenant, claims.job_id, claims.attempt, claims.scope) == (
        "vision",
        "abc",
        2,
        "models:publish",
    )
    with pytest.raises(JobTokenError, match="expired"):
        verify(SECRET, token, now=1060)
    with pytest.raises(JobTokenError, match="bad signature"):
        verify(b"t" * 40, token, now=1000)
    other = sign(SECRET, tenant="vision", job_id="abc", attempt=2, lifetime=60, scope="jobs:submit", now=1000)
    with pytest.raises(JobTokenError, match="not 'models:publish'"):
        verify(SECRET, other, now=1000)


def test_a_job_token_with_another_tenant_written_in_is_refused():
    token = sign(SECRET, tenant="vision", job_id="abc", attempt=1, lifetime=60)
    prefix, payload, mac = token.split(".")
    import base64

    doc = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged = base64.urlsafe_b64encode(json.dumps({**doc, "t": "nlp"}).encode()).rstrip(b"=").decode()
    with pytest.raises(JobTokenError, match="bad signature"):
        verify(SECRET, f"{prefix}.{forged}.{mac}")
    for garbage in ("gyjob1.", "gyjob1.x.y.z", "gyjob1.%%%.@@@", "tok-vision"):
        with pytest.raises(JobTokenError):
            verify(SECRET, garbage)


def test_the_secret_is_made_once_private(tmp_path):
    path = tmp_path / "secrets" / "publish.key"
    secret = ensure_secret(path)
    assert len(secret) >= 32 and ensure_secret(path) == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    path.chmod(0o644)
    with pytest.raises(JobTokenError, match="open to other users"):
        ensure_secret(path)


def test_each_replica_gets_its_jobs_token_and_the_api_url_never_the_secret(tmp_path):
    try:
        jobenv.configure_publishing(jobenv.Publishing(SECRET, "http://api.test:8080", 3600))
        env = jobenv.identity_env(job_id="j1", job_name="n", tenant="vision", attempt=3, replica=0, node="n1")
        assert env["GPUYARD_SERVER"] == "http://api.test:8080"
        claims = verify(SECRET, env["GPUYARD_PUBLISH_TOKEN"])
        assert (claims.tenant, claims.job_id, claims.attempt) == ("vision", "j1", 3)
        assert claims.expires <= time.time() + 3600 + 1
        assert SECRET.decode() not in json.dumps(env) and "secret=***" in repr(jobenv._publishing)
        jobenv.configure_publishing(None)
        env = jobenv.identity_env(job_id="j1", job_name="n", tenant="vision", attempt=3, replica=0, node="n1")
        assert "GPUYARD_PUBLISH_TOKEN" not in env
    finally:
        jobenv.configure_publishing(None)


# ---------------------------------------------------------------- the API


@pytest.fixture
def ctx(tmp_path):
    ensure_secret(tmp_path / "publish.key")
    with submit_context(
        tmp_path,
        TOKENS,
        models=True,
        max_body_bytes=4096,
        max_model_bytes=1 << 20,
        publish_secret_file=tmp_path / "publish.key",
    ) as context:
        yield context


@pytest.fixture
def api(ctx):
    with TestClient(create_app(ctx)) as client:
        yield client


def publish(api, name="mnist", data=None, headers=VISION, expect=201, **params):
    answer = api.post(
        "/v1/models", params={"name": name, **params}, content=data or tiny_model(), headers=headers
    )
    assert answer.status_code == expect, answer.text
    return answer.json()


def test_publishing_numbers_versions_and_reads_the_signature(api, ctx):
    first = publish(api)
    assert (first["version"], first["tenant"], first["duplicate"], first["user"]) == (
        1,
        "vision",
        False,
        "ana",
    )
    assert first["sha256"] == sha256_of(tiny_model()) and first["size_bytes"] == len(tiny_model())
    assert first["inputs"][0] == {"name": "x", "datatype": "FP32", "shape": [-1, 3]}
    second = publish(api, data=tiny_model(3.0))
    assert second["version"] == 2 and "uri" not in second  # where the server keeps it is not the publisher's
    model = api.get("/v1/models/mnist", headers=VISION).json()
    assert [v["version"] for v in model["versions"]] == [1, 2] and model["latest"] == 2
    assert model["versions"][0]["uri"] != model["versions"][1]["uri"]
    assert api.get("/v1/models/mnist/versions/2", headers=VISION).json()["sha256"] == second["sha256"]
    assert load(model["versions"][1]["uri"], second["sha256"]) == tiny_model(3.0)
    [stored_1, stored_2] = asyncio.run(ctx.store.read_stream(stream_id("vision", "mnist")))
    assert stored_2.event.type == "io.gpuyard.model.published" and stored_2.event.data.version == 2
    assert stored_2.event.subject == "vision/mnist"
    listed = api.get("/v1/models", headers=VISION).json()["items"]
    assert [(m["name"], m["latest"], m["versions"]) for m in listed] == [("mnist", 2, 2)]


def test_a_version_is_immutable_and_the_same_bytes_again_answer_it(api):
    publish(api)
    again = publish(api, expect=200)
    assert again["version"] == 1 and again["duplicate"] is True
    assert publish(api, version=1, expect=200)["duplicate"] is True
    refused = api.post(
        "/v1/models", params={"name": "mnist", "version": 1}, content=tiny_model(5.0), headers=VISION
    )
    assert refused.status_code == 409 and "a version never changes" in refused.json()["detail"]
    assert publish(api, data=tiny_model(5.0), version=7)["version"] == 7
    assert publish(api, data=tiny_model(6.0))["version"] == 8  # after the highest


def test_a_file_that_is_not_onnx_gets_422_with_the_reason_and_nothing_is_stored(api, ctx, tmp_path):
    answer = api.post("/v1/models", params={"name": "bad"}, content=b"not a model", headers=VISION)
    assert answer.status_code == 422 and "not a publishable ONNX model" in answer.json()["detail"]
    assert api.get("/v1/models/bad", headers=VISION).status_code == 404
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").rglob("*.onnx"))
    bad_name = api.post("/v1/models", params={"name": "Bad_Name"}, content=tiny_model(), headers=VISION)
    assert bad_name.status_code == 422


def test_the_model_limit_is_its_own_and_the_other_routes_keep_theirs(api):
    big = api.post("/v1/models", params={"name": "big"}, content=b"x" * ((1 << 20) + 1), headers=VISION)
    assert big.status_code == 413
    assert publish(api, data=tiny_model())["version"] == 1  # over the API's 4096 bytes, under the models'


def test_tenants_see_their_own_and_public_models_and_change_only_their_own(api):
    publish(api, name="shared", headers=NLP)
    assert api.get("/v1/models/shared", headers=VISION).status_code == 404
    assert api.get("/v1/models/shared", params={"tenant": "nlp"}, headers=VISION).status_code == 404
    made = api.patch("/v1/models/shared", json={"public": True}, headers=NLP)
    assert made.status_code == 200 and made.json()["public"] is True
    seen = api.get("/v1/models/shared", params={"tenant": "nlp"}, headers=VISION)
    assert seen.status_code == 200 and seen.json()["tenant"] == "nlp"
    listed = api.get("/v1/models", headers=VISION).json()["items"]
    assert [(m["tenant"], m["name"], m["public"]) for m in listed] == [("nlp", "shared", True)]
    for method, path in (("PATCH", "/v1/models/shared"), ("DELETE", "/v1/models/shared")):
        answer = api.request(method, path, params={"tenant": "nlp"}, json={"public": False}, headers=VISION)
        assert answer.status_code == 403 and "only it or an admin" in answer.json()["detail"]
    publish(api, name="shared", headers=VISION)  # vision's own model of the same name: another model
    names = [(m["tenant"], m["name"]) for m in api.get("/v1/models", headers=VISION).json()["items"]]
    assert names == [("nlp", "shared"), ("vision", "shared")]
    assert (
        api.get("/v1/models", params={"tenant": "nlp"}, headers=ADMIN).json()["items"][0]["tenant"] == "nlp"
    )
    assert len(api.get("/v1/models", headers=ADMIN).json()["items"]) == 2
    private = api.patch("/v1/models/shared", params={"tenant": "nlp"}, json={"public": False}, headers=ADMIN)
    assert private.status_code == 200
    assert api.get("/v1/models/shared", params={"tenant": "nlp"}, headers=VISION).status_code == 404


def test_deleting_removes_the_listing_and_the_file_and_never_reuses_a_number(api, ctx):
    publish(api), publish(api, data=tiny_model(3.0))
    one, two = api.get("/v1/models/mnist", headers=VISION).json()["versions"]
    gone = api.delete("/v1/models/mnist/versions/1", headers=VISION)
    assert gone.status_code == 200 and gone.json()["versions"] == [1]
    assert not Path(one["uri"]).exists() and Path(two["uri"]).exists()
    assert api.get("/v1/models/mnist/versions/1", headers=VISION).status_code == 404
    again = api.post(
        "/v1/models", params={"name": "mnist", "version": 1}, content=tiny_model(), headers=VISION
    )
    assert again.status_code == 409 and "deleted" in again.json()["detail"]
    assert publish(api, data=tiny_model())["version"] == 3  # the deleted bytes, as a new version
    assert api.delete("/v1/models/mnist", headers=VISION).json()["versions"] == [2, 3]
    assert api.get("/v1/models/mnist", headers=VISION).status_code == 404
    assert api.get("/v1/models", headers=VISION).json()["items"] == []
    assert api.delete("/v1/models/mnist", headers=VISION).status_code == 404
    assert not Path(two["uri"]).exists()
    assert publish(api)["version"] == 4
    kinds = [s.event.type for s in asyncio.run(ctx.store.read_stream(stream_id("vision", "mnist")))]
    assert kinds.count("io.gpuyard.model.deleted") == 2


def test_models_never_show_among_jobs(api):
    publish(api)
    job = api.post("/v1/jobs", json={"command": "true"}, headers=VISION).json()
    assert [j["job_id"] for j in api.get("/v1/jobs", headers=VISION).json()["items"]] == [job["job_id"]]
    assert len(api.get("/v1/jobs", headers=ADMIN).json()["items"]) == 1
    for prefix in ("model", "model:vision:mnist", "mode"):
        assert api.get(f"/v1/jobs/{prefix}", headers=VISION).status_code == 404


def running_job(ctx, job_id="0123456789abcdef", tenant="vision", attempt_done=False):
    spec = JobSpec(command="true")
    events = [
        JobSubmitted(job_id=job_id, name="train", tenant=tenant, user="ana", spec=spec),
        JobPlaced(job_id=job_id, attempt=1, placements=[ReplicaPlacement(replica=0, node="n1")]),
        JobStarted(job_id=job_id, attempt=1, node="n1", replicas=[0]),
    ]
    if attempt_done:
        events.append(JobSucceeded(job_id=job_id, attempt=1))
    for data in events:
        asyncio.run(ctx.ledger.append(job_id, data))
    return job_id


def job_token(ctx, job_id, tenant="vision", attempt=1, lifetime=600):
    secret = ctx.publish_secret_file.read_bytes().strip()
    return {
        "Authorization": "Bearer "
        + sign(secret, tenant=tenant, job_id=job_id, attempt=attempt, lifetime=lifetime)
    }


def test_a_running_job_publishes_with_its_token_and_is_recorded_as_the_producer(api, ctx):
    job_id = running_job(ctx)
    published = publish(api, headers=job_token(ctx, job_id))
    assert published["job_id"] == job_id and published["tenant"] == "vision" and published["user"] == ""
    assert api.get("/v1/models/mnist", headers=VISION).json()["versions"][0]["job_id"] == job_id


def test_a_job_token_is_refused_everywhere_but_publishing_and_after_its_attempt(api, ctx):
    job_id = running_job(ctx)
    token = job_token(ctx, job_id)
    for method, path in (
        ("GET", "/v1/models"),
        ("GET", "/v1/jobs"),
        ("GET", f"/v1/jobs/{job_id}"),
        ("DELETE", "/v1/models/mnist"),
    ):
        answer = api.request(method, path, headers=token)
        assert answer.status_code == 401 and "POST /v1/models only" in answer.json()["detail"], path
    other_tenant = publish(api, headers=token, tenant="nlp", expect=403)
    assert "not 'nlp'" in other_tenant["detail"]
    forged = publish(
        api, headers=job_token(ctx, job_id, tenant="nlp"), expect=401
    )  # signed, but not nlp's job
    assert "not running" in forged["detail"]
    assert "not running" in publish(api, headers=job_token(ctx, job_id, attempt=2), expect=401)["detail"]
    assert "expired" in publish(api, headers=job_token(ctx, job_id, lifetime=-1), expect=401)["detail"]
    done = running_job(ctx, job_id="fedcba9876543210", attempt_done=True)
    assert "not running" in publish(api, headers=job_token(ctx, done), expect=401)["detail"]
    ctx.publish_secret_file.write_bytes(b"another-secret-" * 4)
    assert "bad signature" in publish(api, headers=token, expect=401)["detail"]


# ---------------------------------------------------------------- the CLI


@pytest.fixture
def cli_api(api, monkeypatch):
    """The CLI against the real app (its TestClient is an httpx.Client)."""

    class AppClient(Client):
        def __init__(self, server=None, token=None, timeout=30):
            super().__init__("http://testserver", token or "tok-vision")
            self.http = api
            self.http.headers["Authorization"] = f"Bearer {self.token}"

    monkeypatch.setattr(cli.common, "Client", AppClient)
    return api


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_cli_publishes_lists_describes_and_removes(cli_api, capsys, tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(tiny_model())
    code, out, _ = run(capsys, "models", "publish", str(path), "--name", "mnist")
    assert code == 0 and "published mnist version 1 (tenant vision" in out
    code, out, _ = run(capsys, "models", "publish", str(path), "--name", "mnist")
    assert code == 0 and "already published as mnist version 1" in out
    code, out, _ = run(capsys, "models", "ls")
    assert code == 0 and out.splitlines()[1].split()[:4] == ["mnist", "vision", "1", "1"]
    code, out, _ = run(capsys, "models", "describe", "mnist", "--json")
    assert code == 0 and json.loads(out)["versions"][0]["inputs"][0]["name"] == "x"
    code, out, _ = run(capsys, "models", "describe", "mnist")
    assert "x FP32[-1,3]" in out and "positive BOOL[-1,3]" in out
    code, _, err = run(capsys, "models", "publish", str(tmp_path / "none.onnx"), "--name", "mnist")
    assert code == 1 and "cannot read" in err and "Traceback" not in err
    (tmp_path / "bad.onnx").write_bytes(b"garbage")
    code, _, err = run(capsys, "models", "publish", str(tmp_path / "bad.onnx"), "--name", "bad")
    assert code == 1 and "not a publishable ONNX model" in err and len(err.strip().splitlines()) == 1
    code, _, err = run(capsys, "models", "rm", "mnist:x")
    assert code == 1 and "NAME:VERSION" in err
    code, out, _ = run(capsys, "models", "rm", "mnist:1")
    assert code == 0 and "removed mnist version 1" in out
    code, _, err = run(capsys, "models", "describe", "mnist")
    assert code == 1 and "no model 'mnist'" in err
    code, out, _ = run(capsys, "models", "ls")
    assert "no models" in out


def test_publish_model_inside_a_job_uses_its_token(api, ctx, monkeypatch, tmp_path):
    import gpuyard
    from gpuyard import publishing

    job_id = running_job(ctx)
    token = job_token(ctx, job_id)["Authorization"].removeprefix("Bearer ")
    monkeypatch.setenv("GPUYARD_PUBLISH_TOKEN", token)
    monkeypatch.setenv("GPUYARD_SERVER", "http://testserver")
    monkeypatch.setenv("HOME", str(tmp_path))  # no saved config
    sent = []

    class AppClient(Client):
        def __init__(self, server=None, token=None, timeout=30):
            super().__init__(server, token)
            sent.append((self.server, self.token))
            self.http = httpx.Client(
                base_url=self.server,
                transport=api._transport,
                headers={"Authorization": f"Bearer {self.token}"},
            )

    monkeypatch.setattr(publishing, "Client", AppClient)
    path = tmp_path / "model.onnx"
    path.write_bytes(tiny_model())
    done = gpuyard.publish_model(path, name="from-job")
    assert done.job_id == job_id and done.version == 1 and sent == [("http://testserver", token)]
