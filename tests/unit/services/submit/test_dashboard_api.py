"""The API routes the dashboard's pages read (and the CLI and integrators with them): the job list's filters,
order and total, a spec validated without being submitted (in JSON or YAML), a spec submitted in YAML, and each
tenant's quota and load. In process, against a real embedded store (tests/unit/services/submit/test_submit_api.py's app)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import yaml

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import GpuShare, JobPlaced, JobStarted, ReplicaPlacement
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from tests.unit.services.submit.test_submit_api import ADMIN, NLP, SPEC, VISION, api, ctx, submit  # noqa: F401 (fixtures)

YAML_SPEC = """\
# as `gpuyard submit job.yaml` reads it
name: train
command: python train.py
resources:
  gpus: 1
env:
  LR: "0.1"
"""
YAML = {"Content-Type": "application/yaml"}


def ids(answer) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [j["job_id"] for j in answer.json()["items"]]


def every_page(api, headers, **params) -> list[str]:  # noqa: F811
    """Every job id of a listing, page after page (two to a page), checking `total` on each."""
    seen: list[str] = []
    cursor = None
    while True:
        answer = api.get("/v1/jobs", headers=headers, params={**params, "limit": 2, "cursor": cursor})
        seen += ids(answer)
        total = answer.json()["total"]
        if not (cursor := answer.json()["next_cursor"]):
            assert len(seen) == len(set(seen)) == total
            return seen


@pytest.fixture
def jobs(api):  # noqa: F811
    """Jobs of two tenants, in this order of submission: vision's by ana (via its token), nlp's by bo."""
    made = [
        submit(api, name="train-resnet"),
        submit(api, headers=NLP, name="train-bert"),
        submit(api, name="eval-50"),
        submit(api, name="sweep"),
    ]
    return [m["job_id"] for m in made]


def test_the_job_list_filters_by_user_name_and_text_and_pages_both_ways(api, jobs):  # noqa: F811
    resnet, bert, eval50, sweep = jobs
    assert every_page(api, ADMIN) == [sweep, eval50, bert, resnet]  # newest first
    assert every_page(api, ADMIN, order="oldest") == [resnet, bert, eval50, sweep]
    assert every_page(api, ADMIN, user="ana") == [sweep, eval50, resnet]
    assert every_page(api, ADMIN, user="bo", order="oldest") == [bert]
    assert every_page(api, ADMIN, name="sweep") == [sweep]
    assert every_page(api, ADMIN, q="TRAIN") == [bert, resnet]  # in the name, any case
    assert every_page(api, ADMIN, q="NLp") == [bert]  # the tenant
    assert every_page(api, ADMIN, q="an") == [sweep, eval50, resnet]  # the user (ana)
    assert every_page(api, ADMIN, q=eval50[3:9].upper()) == [eval50]  # the id
    assert every_page(api, ADMIN, q="%") == [] and every_page(api, ADMIN, q="t_ain") == []  # not wildcards
    assert every_page(api, ADMIN, q="train", state="running") == []
    # a tenant's token finds only its own, whatever it searches for
    assert every_page(api, VISION, q="train") == [resnet]
    assert every_page(api, VISION, user="bo") == []
    assert every_page(api, NLP, q="a") == [bert]


def test_the_job_list_refuses_a_long_search_and_an_unknown_order(api, jobs):  # noqa: F811
    assert api.get("/v1/jobs", params={"q": "x" * 200}, headers=VISION).status_code == 200
    too_long = api.get("/v1/jobs", params={"q": "x" * 201}, headers=VISION)
    assert too_long.status_code == 422 and too_long.json()["detail"][0]["loc"] == ["query", "q"]
    assert api.get("/v1/jobs", params={"order": "random"}, headers=VISION).status_code == 422


def test_a_cursor_is_a_place_in_the_listing_whichever_the_order(api, jobs):  # noqa: F811
    """A page's cursor is the place after its last job: with the other order, the listing goes the other way
    from there (the jobs before it)."""
    newest = ids(api.get("/v1/jobs", params={"order": "newest"}, headers=VISION))
    cursor = api.get("/v1/jobs", params={"limit": 2}, headers=VISION).json()["next_cursor"]
    back = api.get("/v1/jobs", params={"cursor": cursor, "order": "oldest"}, headers=VISION)
    assert ids(back) == [newest[0]]


def test_the_job_list_holds_jobs_only(api, ctx, jobs):  # noqa: F811
    """The store holds models' streams too (and alerts', nodes'): never listed nor counted as jobs."""
    from tests.unit.services.submit.onnxmodels import tiny_model

    published = api.post("/v1/models", params={"name": "train-model"}, content=tiny_model(), headers=VISION)
    assert published.status_code == 201, published.text
    answer = api.get("/v1/jobs", params={"q": "train"}, headers=ADMIN).json()
    assert answer["total"] == 2 and len(answer["items"]) == 2


def test_a_spec_is_validated_in_json_or_yaml_and_nothing_is_recorded(api, ctx):  # noqa: F811
    as_json = api.post("/v1/jobs/validate", json=SPEC, headers=VISION)
    assert as_json.status_code == 200, as_json.text
    body = as_json.json()
    assert body["valid"] and body["placeable"] and body["tenant"] == "vision"
    assert body["spec"]["resources"]["gpus"] == 1 and body["spec"]["replicas"] == 1  # the default filled in
    as_yaml = api.post("/v1/jobs/validate", content=YAML_SPEC, headers={**VISION, **YAML})
    assert as_yaml.status_code == 200, as_yaml.text
    assert as_yaml.json()["spec"] == {**body["spec"], "env": {"LR": "0.1"}}
    text_yaml = api.post(
        "/v1/jobs/validate", content=YAML_SPEC, headers={**VISION, "Content-Type": "text/yaml"}
    )
    assert text_yaml.json() == as_yaml.json()
    assert api.get("/v1/jobs", headers=ADMIN).json()["total"] == 0
    assert asyncio.run(ctx.store.unpublished(older_than=0)) == []  # no event either


def test_an_invalid_spec_gets_the_422_a_submit_gets_and_a_yaml_error_its_line_and_column(api):  # noqa: F811
    bad = {**SPEC, "resources": {"gpus": 1.5}, "gpu": 2}
    validated = api.post("/v1/jobs/validate", json=bad, headers=VISION)
    submitted = api.post("/v1/jobs", json=bad, headers=VISION)
    assert validated.status_code == submitted.status_code == 422
    assert validated.json() == submitted.json()
    assert {tuple(e["loc"]) for e in validated.json()["detail"]} == {
        ("body", "resources", "gpus"),
        ("body", "gpu"),
    }
    in_yaml = api.post("/v1/jobs/validate", content=yaml.safe_dump(bad), headers={**VISION, **YAML})
    assert in_yaml.json() == validated.json()

    broken = api.post(
        "/v1/jobs/validate",
        content="name: train\ncommand: [python\nresources: {}\n",
        headers={**VISION, **YAML},
    )
    assert broken.status_code == 422
    [error] = broken.json()["detail"]
    assert error["type"] == "yaml_invalid" and error["loc"] == ["body", 3, 10]
    assert "line 3, column 10" in error["msg"]
    for text, why in (
        ("- a list", "must be a mapping"),
        ("a: &a [*a, *a]", "aliases"),  # a structure that holds itself
        ("\xff", "not UTF-8"),
        ("a: \x01", "not valid YAML"),  # a control character
    ):
        refused = api.post("/v1/jobs/validate", content=text.encode("latin-1"), headers={**VISION, **YAML})
        assert refused.status_code == 422 and why in refused.text, (text, refused.text)
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
        for p, c in zip("abcdefg", "bcdefgh", strict=True)
    )  # a few hundred bytes that expand to 10**8 values
    refused = api.post("/v1/jobs/validate", content=bomb, headers={**VISION, **YAML})
    assert refused.status_code == 422 and "aliases" in refused.text


def test_validation_refuses_what_a_submit_refuses_for_the_tenant_and_the_nodes(api, ctx):  # noqa: F811
    other = api.post("/v1/jobs/validate", json={**SPEC, "tenant": "nlp"}, headers=VISION)
    assert other.status_code == 403
    assert api.post("/v1/jobs/validate", json={**SPEC, "tenant": "nlp"}, headers=ADMIN).status_code == 200
    node = NodeHeartbeat(
        node="n1", gpus=[GpuInfo(index=0, uuid="GPU-0", model="H100", memory_bytes=80 << 30)], cpus=8,
        memory_bytes=64 << 30, interval_seconds=3600,
    )  # fmt: skip
    ctx.telemetry.observe(make_event(node, source="/test"))
    too_big = {**SPEC, "resources": {"gpus": 2}}
    refused = api.post("/v1/jobs/validate", json=too_big, headers=VISION)
    assert refused.status_code == 422 and "no node could ever hold" in refused.json()["detail"]
    assert api.post("/v1/jobs", json=too_big, headers=VISION).json() == refused.json()
    fits = api.post("/v1/jobs/validate", json=SPEC, headers=VISION).json()
    assert fits["placeable"] and "would queue it" in fits["message"]
    ctx.accept_unplaceable = True
    answer = api.post("/v1/jobs/validate", json=too_big, headers=VISION)
    assert answer.status_code == 200 and not answer.json()["placeable"]
    assert "largest node has 1" in answer.json()["message"]


def test_validation_says_when_the_tenants_queue_is_at_its_limit(api, ctx):  # noqa: F811
    from gpuyard.services.submit.queuedepth import QueueDepth

    ctx.queue = QueueDepth(limit=1)
    assert "limit" not in api.post("/v1/jobs/validate", json=SPEC, headers=VISION).json()["message"]
    submit(api)
    answer = api.post("/v1/jobs/validate", json=SPEC, headers=VISION)
    assert answer.status_code == 200 and "a submit now gets 429" in answer.json()["message"]
    assert api.post("/v1/jobs", json=SPEC, headers=VISION).status_code == 429
    assert "limit" not in api.post("/v1/jobs/validate", json=SPEC, headers=NLP).json()["message"]


def test_a_job_submitted_in_yaml_is_the_job_submitted_in_json(api):  # noqa: F811
    accepted = api.post("/v1/jobs", content=YAML_SPEC, headers={**VISION, **YAML})
    assert accepted.status_code == 202, accepted.text
    job = api.get(f"/v1/jobs/{accepted.json()['job_id']}", headers=VISION).json()
    assert job["spec"]["command"] == "python train.py" and job["spec"]["env"] == {"LR": "0.1"}
    again = api.post(
        "/v1/jobs", content=YAML_SPEC, headers={**VISION, **YAML, "Idempotency-Key": "k1"}
    ).json()
    as_json = api.post(
        "/v1/jobs",
        json={**SPEC, "env": {"LR": "0.1"}},
        headers={**VISION, "Idempotency-Key": "k1"},
    ).json()
    assert as_json == {**again, "duplicate": True}  # one request, whichever way it was written
    broken = api.post("/v1/jobs", content="command: 'unclosed", headers={**VISION, **YAML})
    assert broken.status_code == 422 and broken.json()["detail"][0]["type"] == "yaml_invalid"


def hold(ctx, job_id: str, shares: list[float], *, borrowed: bool = False, start: bool = True) -> None:  # noqa: F811
    """Place the job on GPUs of node n1 (each share a GPU's fraction), then start it."""
    placement = ReplicaPlacement(
        replica=0, node="n1", gpus=[GpuShare(index=i, fraction=f) for i, f in enumerate(shares)]
    )
    asyncio.run(
        ctx.ledger.append(
            job_id, JobPlaced(job_id=job_id, attempt=1, placements=[placement], borrowed=borrowed)
        )
    )
    if start:
        asyncio.run(ctx.ledger.append(job_id, JobStarted(job_id=job_id, attempt=1, node="n1", replicas=[0])))


def test_each_tenant_sees_its_quota_and_load_and_an_admin_sees_every_tenant(api, ctx):  # noqa: F811
    ctx.quotas = {"vision": 4.0, "audio": 2.0}
    before = datetime.now(UTC)
    first_queued = submit(api)["job_id"]
    submit(api)
    hold(ctx, submit(api, resources={"gpus": 2})["job_id"], [1.0, 1.0])
    hold(ctx, submit(api, resources={"gpus": 0.5})["job_id"], [0.5], start=False)
    hold(ctx, submit(api, headers=NLP)["job_id"], [1.0], borrowed=True)
    hold(ctx, submit(api, headers=NLP, resources={"gpus": 0.25})["job_id"], [0.25])
    api.post(f"/v1/jobs/{submit(api, headers=NLP)['job_id']}/cancel", headers=NLP)  # ended: not counted

    mine = api.get("/v1/tenants", headers=VISION)
    assert mine.status_code == 200, mine.text
    [vision] = mine.json()["items"]
    waited = vision.pop("oldest_queued_seconds")
    assert vision == {
        "tenant": "vision",
        "guaranteed_gpus": 4.0,
        "used_gpus": 2.5,
        "borrowed_gpus": 0.0,
        "queued": 2,
        "placed": 1,
        "running": 1,
    }
    created = datetime.fromisoformat(api.get(f"/v1/jobs/{first_queued}", headers=VISION).json()["created_at"])
    assert 0 <= waited <= (datetime.now(UTC) - created).total_seconds()
    assert created >= before - timedelta(seconds=1)

    [nlp] = api.get("/v1/tenants", headers=NLP).json()["items"]
    assert (nlp["used_gpus"], nlp["borrowed_gpus"], nlp["running"], nlp["queued"]) == (1.25, 1.0, 2, 0)
    assert nlp["guaranteed_gpus"] == 0 and nlp["oldest_queued_seconds"] is None

    every = api.get("/v1/tenants", headers=ADMIN).json()["items"]
    assert [t["tenant"] for t in every] == ["audio", "nlp", "vision"]  # a quota, or live jobs
    assert every[0] == {
        "tenant": "audio",
        "guaranteed_gpus": 2.0,
        "used_gpus": 0.0,
        "borrowed_gpus": 0.0,
        "queued": 0,
        "placed": 0,
        "running": 0,
        "oldest_queued_seconds": None,
    }
    assert every[1] == {**nlp, "oldest_queued_seconds": None}


def test_a_tenant_with_nothing_gets_its_own_empty_row(api):  # noqa: F811
    [row] = api.get("/v1/tenants", headers=VISION).json()["items"]
    assert row["tenant"] == "vision" and row["queued"] == row["running"] == 0 and row["used_gpus"] == 0
    assert api.get("/v1/tenants", headers=ADMIN).json()["items"] == []
    assert api.get("/v1/tenants").status_code == 401


@pytest.fixture
def gpuyard(api, monkeypatch, capsys):  # noqa: F811
    """Run `gpuyard ARGS` with a token, against the app; its exit status and output."""
    from fastapi.testclient import TestClient

    from gpuyard import cli

    monkeypatch.setattr(
        "gpuyard.client.httpx.Client",
        lambda base_url, headers, timeout: TestClient(api.app, base_url=base_url, headers=headers),
    )

    def run(*args: str, token: str = "tok-admin") -> tuple[int, str]:
        code = cli.main([*args, "--server", "http://testserver", "--token", token])
        return code, capsys.readouterr().out

    return run


def test_ps_finds_jobs_by_user_name_and_text(gpuyard, jobs):
    resnet, bert, eval50, sweep = jobs

    def listed(*args: str, token: str = "tok-admin") -> list[str]:
        code, out = gpuyard("ps", *args, token=token)
        assert code == 0, out
        return [line.split()[0] for line in out.splitlines()[1:] if line.strip() and " of " not in line]

    assert listed("--user", "bo") == [bert]
    assert listed("--name", "sweep") == [sweep]
    assert listed("--search", "TRAIN") == [bert, resnet]
    assert listed("--search", "train", token="tok-vision") == [resnet]
    assert listed("--search", "train", "--user", "ana") == [resnet]
    code, out = gpuyard("ps", "--limit", "1")
    assert out.splitlines()[-1] == "1 of 4 jobs, the newest (--limit for more)"
    code, out = gpuyard("ps", "--search", "x" * 201)
    assert code == 1 and "Traceback" not in out
