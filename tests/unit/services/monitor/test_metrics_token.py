"""The monitor's and the serving entry point's /metrics name tenants, jobs, users and models: by default they
answer only a scrape that carries the scrape token (Prometheus's bearer token, or the password of its basic
auth), 401 otherwise; the token is a file of the data dir made at start (0600), read again when it changes;
`metrics_auth=off` opens them. On serving, a tenant's own token reads its own models' series only."""

from __future__ import annotations

import base64
import os
import stat
from pathlib import Path

import httpx
import pytest
import yaml
from starlette.applications import Starlette
from starlette.routing import Route

from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.metrics import METRICS_PATH, GuardedMetricsServer, make_registry
from gpuyard.services.serving import metrics as serving_metrics
from gpuyard.services.serving.access import Access
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Routes
from gpuyard.services.serving.stats import Stats
from gpuyard.shared.auth.secretfile import METRICS_TOKEN_FILE, ScrapeAuth
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuSample
from gpuyard.shared.gpus.nvml import Nvml
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.supervisor.scrapeconfig import token_file, write_scrape_config
from tests.unit.services.monitor.test_nvml import FakeGpu, FakeNvml


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


@pytest.mark.parametrize("settings", [MonitorSettings, ServingSettings])
def test_by_default_a_token_is_made_in_the_data_dir_and_needed(tmp_path, settings):
    auth = ScrapeAuth.from_settings(settings(data_dir=tmp_path))
    path = tmp_path / METRICS_TOKEN_FILE
    assert auth.path == path and stat.S_IMODE(path.stat().st_mode) == 0o600
    token = path.read_text().strip()
    assert len(token) >= 32
    assert auth.allows(f"Bearer {token}") and auth.allows(basic("prometheus", token)["Authorization"])
    for refused in (None, "", "Bearer", "Bearer wrong", f"Token {token}", basic(token, "x")["Authorization"]):
        assert not auth.allows(refused), refused
    assert not auth.allows("Basic %%%not-base64")
    # the same file for both services, and an operator's own file and choice
    assert ScrapeAuth.from_settings(ServingSettings(data_dir=tmp_path)).allows(f"Bearer {token}")
    assert ScrapeAuth.from_settings(settings(data_dir=tmp_path, metrics_auth="off")).allows(None)


def test_a_new_token_takes_effect_at_the_next_scrape_and_a_bad_file_refuses_all(tmp_path):
    own = tmp_path / "scrape.token"
    auth = ScrapeAuth.from_settings(MonitorSettings(data_dir=tmp_path, metrics_token_file=own))
    old = own.read_text().strip()
    assert auth.allows(f"Bearer {old}") and not (tmp_path / METRICS_TOKEN_FILE).exists()
    replacement = tmp_path / "next"
    replacement.write_text("n" * 40 + "\n")
    replacement.chmod(0o600)
    os.replace(replacement, own)
    assert auth.allows("Bearer " + "n" * 40) and not auth.allows(f"Bearer {old}")
    own.chmod(0o644)  # (open to others: not a secret any more)
    os.utime(own, ns=(1, 1))
    assert not auth.allows("Bearer " + "n" * 40)


@pytest.fixture
def monitor_metrics(tmp_path):
    ingest = SampleIngest()
    holder = GpuHolder(job_id="j-secret", tenant="vision", user="ana")
    gpus = [r.model_copy(update={"holders": [holder]}) for r in Nvml(FakeNvml([FakeGpu()])).open().read()]
    ingest.ingest(make_event(GpuSample(node="node-a", gpus=gpus), source="/test"))
    auth = ScrapeAuth.from_settings(MonitorSettings(data_dir=tmp_path))
    server = GuardedMetricsServer(make_registry(ingest, None), "127.0.0.1", 0, auth=auth, path=METRICS_PATH)
    server.start()
    yield f"http://127.0.0.1:{server.port}{METRICS_PATH}", (tmp_path / METRICS_TOKEN_FILE).read_text().strip()
    server.stop()


def test_the_monitors_metrics_answer_401_without_the_token_and_200_with_it(monitor_metrics):
    url, token = monitor_metrics
    for headers in ({}, bearer("wrong"), basic("prometheus", "wrong")):
        refused = httpx.get(url, headers=headers, timeout=10)
        assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
        assert (
            "j-secret" not in refused.text and "vision" not in refused.text and "scrape token" in refused.text
        )
    for headers in (bearer(token), basic("prometheus", token)):
        answered = httpx.get(url, headers=headers, timeout=10)
        assert (
            answered.status_code == 200
            and 'job="j-secret"' in answered.text
            and 'user="ana"' in answered.text
        )
    assert httpx.get(url.replace(METRICS_PATH, "/other"), timeout=10).status_code == 404


TOKENS = "tok-vision=vision:ana,tok-nlp=nlp:bo,tok-root=ops:root:admin"


class NoCatalog:
    async def get(self, tenant: str, name: str):
        return None


@pytest.fixture
def serving(tmp_path):
    stats = Stats()
    stats.of("vision/mnist", "1").observe(0.01, True)
    stats.of("nlp/secret-model", "2").observe(0.02, False)
    access = Access(Tokens(None, TOKENS), NoCatalog(), ModelRegistry(), Routes("node-a"))
    auth = ScrapeAuth.from_settings(ServingSettings(data_dir=tmp_path))
    endpoint = serving_metrics.endpoint(stats, access, auth)
    app = Starlette(routes=[Route("/metrics", endpoint, methods=["GET"])])
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://serving")
    return client, (tmp_path / METRICS_TOKEN_FILE).read_text().strip()


async def test_servings_metrics_answer_401_without_a_token_and_a_tenant_its_own_models(serving):
    client, token = serving
    refused = await client.get("/metrics")
    assert refused.status_code == 401 and "secret-model" not in refused.text and "mnist" not in refused.text
    assert (await client.get("/metrics", headers=bearer("wrong"))).status_code == 401
    for everything in (bearer(token), basic("prometheus", token), bearer("tok-root")):
        text = (await client.get("/metrics", headers=everything)).text
        assert 'model="mnist"' in text and 'model="secret-model"' in text
    own = await client.get("/metrics", headers=bearer("tok-vision"))
    assert own.status_code == 200 and 'model="mnist"' in own.text and "secret-model" not in own.text
    assert 'tenant="nlp"' not in own.text


def test_the_scrape_configuration_sends_the_token_that_the_services_ask_for(tmp_path):
    """What `gpuyard up` writes beside the targets file: both scrape jobs carry the token's file as
    Prometheus's bearer credentials; with `metrics_auth=off`, none."""
    token = token_file(MonitorSettings(data_dir=tmp_path))
    path = write_scrape_config(tmp_path, "127.0.0.1:9400", tmp_path / "prometheus-targets.json", token)
    assert path == tmp_path / "prometheus.yml" and stat.S_IMODE(path.stat().st_mode) == 0o600
    config = yaml.safe_load(path.read_text())
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["gpuyard-monitor"]["static_configs"] == [{"targets": ["127.0.0.1:9400"]}]
    assert jobs["gpuyard-services"]["file_sd_configs"] == [
        {"files": [str(tmp_path / "prometheus-targets.json")]}
    ]
    for job in jobs.values():
        assert job["authorization"] == {
            "type": "Bearer",
            "credentials_file": str(tmp_path / METRICS_TOKEN_FILE),
        }
    sent = Path(jobs["gpuyard-monitor"]["authorization"]["credentials_file"]).read_text().strip()
    assert ScrapeAuth.from_settings(ServingSettings(data_dir=tmp_path)).allows(f"Bearer {sent}")
    off = token_file(MonitorSettings(data_dir=tmp_path, metrics_auth="off"))
    opened = yaml.safe_load(write_scrape_config(tmp_path, "h:1", tmp_path / "t.json", off).read_text())
    assert off is None and all("authorization" not in job for job in opened["scrape_configs"])
