"""The volumes' Prometheus figures (`services/submit/volumemetrics.py`) against a real embedded store and real
folders, the volumes made, filled and deleted through the API: each volume's size and use per tenant, each
tenant's volume quota where it has one; a deleted volume's series gone; a job's writes (no event) counted once
the volume is measured again, not before."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.volumemetrics import REMEASURE_SECONDS, VolumeMetrics
from gpuyard.shared.auth.secretfile import ScrapeAuth
from gpuyard.shared.runtime.paths import volume_dir
from tests.unit.services.submit.submitctx import submit_context

VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}
QUOTAS = {"vision": 10_000, "audio": 5_000}  # nlp: none; audio: named, no volume yet


@pytest.fixture
def yard(tmp_path):
    with (
        submit_context(tmp_path, volumes=True, volume_quotas=QUOTAS) as ctx,
        TestClient(create_app(ctx)) as api,
    ):
        yield api, VolumeMetrics(ctx.volumes, ctx.volume_files, ctx.volume_quotas)


def scrape(metrics: VolumeMetrics) -> dict[str, dict[tuple[str, ...], float]]:
    """The registry's text as Prometheus reads it: family -> label values -> value."""
    text = generate_latest(metrics.registry).decode()
    return {
        family.name: {tuple(s.labels.values()): s.value for s in family.samples}
        for family in text_string_to_metric_families(text)
    }


def made(api, name: str, size: int, who: dict, content: bytes = b"") -> None:
    assert api.post("/v1/volumes", json={"name": name, "size": size}, headers=who).status_code == 201
    if content:
        put = api.put(f"/v1/volumes/{name}/content", params={"path": "f.bin"}, content=content, headers=who)
        assert put.status_code == 201, put.text


def test_each_volume_s_size_and_use_and_each_tenant_s_quota_and_a_deleted_one_gone(yard):
    api, metrics = yard
    made(api, "images", 8000, VISION, b"x" * 1500)
    made(api, "corpus", 3000, NLP, b"y" * 700)
    asyncio.run(metrics.refresh())
    figures = scrape(metrics)
    assert figures["gpuyard_volume_size_bytes"] == {("vision", "images"): 8000, ("nlp", "corpus"): 3000}
    assert figures["gpuyard_volume_used_bytes"] == {("vision", "images"): 1500, ("nlp", "corpus"): 700}
    assert figures["gpuyard_volume_quota_bytes"] == {("audio",): 5000, ("vision",): 10_000}

    more = api.put("/v1/volumes/images/content", params={"path": "g.bin"}, content=b"z" * 500, headers=VISION)
    assert more.status_code == 201, more.text  # (recorded: measured again at the next refresh)
    assert api.delete("/v1/volumes/corpus", headers=NLP).status_code == 200
    asyncio.run(metrics.refresh())
    figures = scrape(metrics)
    assert figures["gpuyard_volume_size_bytes"] == {("vision", "images"): 8000}
    assert figures["gpuyard_volume_used_bytes"] == {("vision", "images"): 2000}


def test_what_a_job_writes_counts_once_the_volume_is_measured_again(yard, tmp_path):
    api, metrics = yard
    made(api, "images", 8000, VISION, b"x" * 1000)
    asyncio.run(metrics.refresh(now=1000.0))
    (volume_dir(tmp_path / "storage", "vision", "images") / "written-by-a-job").write_bytes(b"j" * 300)
    asyncio.run(metrics.refresh(now=1000.0 + REMEASURE_SECONDS / 2))  # unchanged in the registry: not walked
    assert scrape(metrics)["gpuyard_volume_used_bytes"] == {("vision", "images"): 1000}
    asyncio.run(metrics.refresh(now=1000.0 + REMEASURE_SECONDS))
    assert scrape(metrics)["gpuyard_volume_used_bytes"] == {("vision", "images"): 1300}


def test_nothing_before_the_first_refresh_and_no_volume_no_series(yard):
    _, metrics = yard
    figures = scrape(metrics)
    assert figures["gpuyard_volume_size_bytes"] == {} and figures["gpuyard_volume_quota_bytes"] == {}
    asyncio.run(metrics.refresh())
    figures = scrape(metrics)
    assert figures["gpuyard_volume_size_bytes"] == {} and figures["gpuyard_volume_used_bytes"] == {}
    assert figures["gpuyard_volume_quota_bytes"] == {("audio",): 5000, ("vision",): 10_000}


def test_the_api_s_metrics_show_the_volumes_only_to_a_scrape_with_the_token(tmp_path):
    """They name tenants and volumes: a request without the scrape token (a tenant's own token included) gets
    the service's figures without them; Prometheus, with it, gets them."""
    token_file = tmp_path / "metrics.token"
    token_file.write_text("scrape-secret-of-at-least-32-bytes-long")
    token_file.chmod(0o600)
    with submit_context(tmp_path, volumes=True) as ctx, TestClient(create_app(ctx)) as api:
        ctx.volume_metrics = VolumeMetrics(ctx.volumes, ctx.volume_files, {})
        ctx.scrape = ScrapeAuth(token_file)
        made(api, "imagenet", 1000, VISION, b"abc")
        asyncio.run(ctx.volume_metrics.refresh())
        for headers in ({}, VISION, {"Authorization": "Bearer wrong"}):
            answer = api.get("/metrics", headers=headers)
            assert answer.status_code == 200 and "gpuyard_volume_" not in answer.text, headers
        shown = api.get(
            "/metrics", headers={"Authorization": "Bearer scrape-secret-of-at-least-32-bytes-long"}
        ).text
        assert 'gpuyard_volume_used_bytes{tenant="vision",volume="imagenet"} 3.0' in shown
