"""Model deployments, the submit API's and the CLI's side: a deployment is one serve job
per replica, queued as any job is, named NAME:VERSION, holding its GPU share; undeploying cancels them; tenants
deploy their own models and public ones, nothing else."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from gpuyard import cli
from gpuyard.client import Client
from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.queuedepth import QueueDepth
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


@pytest.fixture
def ctx(tmp_path):
    with submit_context(
        tmp_path, TOKENS, queue=QueueDepth(limit=3), models=True, max_model_bytes=1 << 20
    ) as c:
        yield c


@pytest.fixture
def api(ctx):
    with TestClient(create_app(ctx)) as client:
        yield client


def publish(api, name="mnist", headers=VISION, **params):
    answer = api.post("/v1/models", params={"name": name, **params}, content=tiny_model(), headers=headers)
    assert answer.status_code in (200, 201), answer.text
    return answer.json()


def deploy(api, name="mnist", headers=VISION, expect=202, params=None, **body):
    answer = api.post(f"/v1/models/{name}/deployments", json=body, headers=headers, params=params)
    assert answer.status_code == expect, answer.text
    return answer.json()


def test_a_deployment_is_one_serve_job_per_replica_named_after_the_model_with_its_gpu_share(api):
    publish(api)
    done = deploy(api, gpus=0.25, replicas=2, priority="high")
    assert done["name"] == "mnist" and done["tenant"] == "vision" and done["version"] == 1
    assert [j["name"] for j in done["jobs"]] == ["mnist:1", "mnist:1"]
    job = api.get(f"/v1/jobs/{done['jobs'][0]['job_id']}", headers=VISION).json()
    assert job["state"] == "queued" and job["gpus"] == 0.25 and job["spec"]["priority"] == "high"
    assert job["spec"]["serve"] == {"model": "mnist", "version": 1, "tenant": None}
    assert job["spec"]["command"] is None and job["spec"]["replicas"] == 1 and job["spec"]["max_retries"] == 5
    listed = api.get("/v1/models/mnist/deployments", headers=VISION).json()
    assert sorted(r["job_id"] for r in listed["replicas"]) == sorted(j["job_id"] for j in done["jobs"])
    assert {(r["version"], r["state"], r["gpus"], r["node"]) for r in listed["replicas"]} == {
        (1, "queued", 0.25, None)
    }


def test_the_newest_version_is_deployed_unless_one_is_named(api):
    publish(api)
    api.post("/v1/models", params={"name": "mnist"}, content=tiny_model(3.0), headers=VISION)
    assert deploy(api)["version"] == 2
    assert deploy(api, version=1)["version"] == 1
    assert [
        r["version"]
        for r in api.get("/v1/models/mnist/deployments?version=1", headers=VISION).json()["replicas"]
    ] == [1]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"gpus": 1.5}, "whole number"),
        ({"gpus": -1}, "greater than or equal"),
        ({"replicas": 0}, "greater than or equal to 1"),
        ({"replicas": 65}, "less than or equal to 64"),
        ({"priority": "urgent"}, "unknown priority class"),
        ({"memory": "lots"}, "size"),
        ({"command": "python serve.py"}, "Extra inputs"),
    ],
)
def test_bad_numbers_are_refused_with_the_reason(api, body, words):
    publish(api)
    assert words in json.dumps(deploy(api, expect=422, **body))


def test_an_unknown_model_or_version_is_404(api):
    assert "no model 'nothing'" in deploy(api, "nothing", expect=404)["detail"]
    publish(api)
    assert "has no version 7" in deploy(api, version=7, expect=404)["detail"]


def test_another_tenants_private_model_is_not_deployable_and_a_public_one_is(api, ctx):
    publish(api, name="private")
    publish(api, name="shared", public="true")
    assert deploy(api, "private", headers=NLP, params={"tenant": "vision"}, expect=404)
    done = deploy(api, "shared", headers=NLP, params={"tenant": "vision"}, gpus=0.5)
    job = api.get(f"/v1/jobs/{done['jobs'][0]['job_id']}", headers=NLP).json()
    assert job["tenant"] == "nlp"  # its quota pays
    assert job["spec"]["serve"] == {"model": "shared", "version": 1, "tenant": "vision"}
    theirs = api.get("/v1/models/shared/deployments", params={"tenant": "vision"}, headers=VISION).json()
    assert theirs["replicas"] == []  # nlp's deployment is nlp's business
    assert len(api.get("/v1/models/shared/deployments?tenant=vision", headers=NLP).json()["replicas"]) == 1
    assert len(api.get("/v1/models/shared/deployments?tenant=vision", headers=ADMIN).json()["replicas"]) == 1


def test_a_serve_spec_sent_to_the_jobs_route_must_name_a_model_the_caller_may_use(api):
    publish(api, name="private")
    spec = {"serve": {"model": "private", "version": 1, "tenant": "vision"}}
    refused = api.post("/v1/jobs", json=spec, headers=NLP)
    assert refused.status_code == 422 and "serve: no model 'private'" in refused.text
    assert (
        api.post("/v1/jobs", json={"serve": {"model": "private", "version": 2}}, headers=VISION).status_code
        == 422
    )
    accepted = api.post("/v1/jobs", json={"serve": {"model": "private", "version": 1}}, headers=VISION)
    assert accepted.status_code == 202 and accepted.json()["name"] == "private:1"
    both = api.post("/v1/jobs", json={**spec, "command": "true"}, headers=VISION)
    assert both.status_code == 422 and "no command" in both.text


def test_undeploy_cancels_the_replicas_through_the_jobs_cancel(api):
    publish(api)
    api.post("/v1/models", params={"name": "mnist"}, content=tiny_model(3.0), headers=VISION)
    first = deploy(api, version=1)
    second = deploy(api, version=2)
    assert (
        api.delete("/v1/models/mnist/deployments", params={"version": 9}, headers=VISION).status_code == 404
    )
    gone = api.delete("/v1/models/mnist/deployments", params={"version": 1}, headers=VISION).json()
    assert [c["job_id"] for c in gone["cancelled"]] == [first["jobs"][0]["job_id"]]
    assert gone["cancelled"][0]["state"] == "cancelled"  # queued: at once
    left = api.get("/v1/models/mnist/deployments", headers=VISION).json()["replicas"]
    assert [r["job_id"] for r in left] == [second["jobs"][0]["job_id"]]
    assert api.delete("/v1/models/mnist/deployments", headers=NLP).status_code == 404  # not nlp's to see
    assert len(api.delete("/v1/models/mnist/deployments", headers=VISION).json()["cancelled"]) == 1
    assert api.delete("/v1/models/mnist/deployments", headers=VISION).status_code == 404  # nothing left


def test_a_deployment_the_queue_limit_cannot_hold_whole_is_refused_whole(api):
    publish(api)
    refused = api.post("/v1/models/mnist/deployments", json={"replicas": 4}, headers=VISION)
    assert refused.status_code == 429 and "Retry-After" in refused.headers
    assert api.get("/v1/models/mnist/deployments", headers=VISION).json()["replicas"] == []


def test_a_retried_deployment_answers_the_same_jobs(api):
    publish(api)
    key = {"Idempotency-Key": "deploy-1", **VISION}
    first = api.post("/v1/models/mnist/deployments", json={"replicas": 2}, headers=key).json()
    again = api.post("/v1/models/mnist/deployments", json={"replicas": 2}, headers=key).json()
    assert [j["job_id"] for j in again["jobs"]] == [j["job_id"] for j in first["jobs"]]
    assert all(j["duplicate"] for j in again["jobs"])


def test_publishing_with_serve_deploys_the_version_published_once(api):
    done = publish(api, serve_gpus=0.25, serve_replicas=2)
    assert done["deployment"]["version"] == 1 and len(done["deployment"]["jobs"]) == 2
    again = publish(api, serve_gpus=0.25, serve_replicas=2)  # a retried publish: the same jobs
    assert again["duplicate"] and again["deployment"]["jobs"] == [
        {**j, "duplicate": True} for j in done["deployment"]["jobs"]
    ]
    assert publish(api, name="plain")["deployment"] is None
    assert publish(api, name="defaults", serve="true")["deployment"]["jobs"][0]["name"] == "defaults:1"
    bad = api.post(
        "/v1/models", params={"name": "x", "serve_gpus": 1.5}, content=tiny_model(), headers=VISION
    )
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "serve_gpus"]
    assert "more than one GPU must be a whole number" in bad.json()["detail"][0]["msg"]


# ---------------------------------------------------------------- the CLI


@pytest.fixture
def cli_api(api, monkeypatch):
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


def test_the_cli_deploys_shows_and_undeploys(cli_api, capsys):
    publish(cli_api)
    code, out, _ = run(capsys, "models", "deploy", "mnist", "--gpus", "0.25", "--replicas", "2")
    assert code == 0 and "deploying mnist:1: 2 replicas queued" in out
    code, out, _ = run(capsys, "ps")
    rows = [line.split() for line in out.splitlines()[1:]]
    assert [(r[1], r[3], r[4]) for r in rows] == [("mnist:1", "queued", "0.25")] * 2  # NAME, STATE, GPUS
    code, out, _ = run(capsys, "models", "describe", "mnist")
    assert "2 replica(s) not ended" in out and out.count("version 1 · queued · 0.25 GPU") == 2
    job_id = rows[0][0]
    code, out, _ = run(capsys, "describe", job_id)
    assert code == 0 and "Serves" in out and "model mnist:1" in out
    code, out, _ = run(capsys, "models", "undeploy", "mnist:1")
    assert code == 0 and "undeploying mnist:1: 2 replicas cancelled or stopping" in out
    code, out, _ = run(capsys, "models", "describe", "mnist")
    assert "Deployments" in out and "none" in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["models", "deploy", "mnist:x"], "NAME:VERSION"),
        (["models", "deploy", "mnist", "--gpus", "1.5"], "whole number"),
        (["models", "deploy", "mnist", "--replicas", "0"], "replicas"),
        (["models", "deploy", "nothing"], "no model 'nothing'"),
        (["models", "deploy", "mnist:5"], "has no version 5"),
        (["models", "undeploy", "mnist"], "no deployment of mnist"),
    ],
)
def test_the_cli_says_why_a_deployment_is_refused_in_one_line(cli_api, capsys, argv, words):
    publish(cli_api)
    code, _, err = run(capsys, *argv)
    assert code == 1 and words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
