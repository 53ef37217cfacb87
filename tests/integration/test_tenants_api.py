"""`GET /v1/tenants` on a real platform (`gpuyard up` with GPUYARD_QUOTAS): each tenant's guarantee from the
setting the scheduler reads, its jobs' GPUs used and borrowed as the scheduler placed them, the same figures
the monitor's /metrics shows (one definition, `shared/reporting/quotause.py`)."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.shared.auth.secretfile import METRICS_TOKEN_FILE

from .conftest import Platform, wait_for

pytestmark = pytest.mark.integration

SLEEPER = {"command": "sleep 120", "resources": {"gpus": 1, "cpus": 0.1}}


def quota_metrics(platform: Platform) -> dict[tuple[str, str], float]:
    """(figure, tenant) -> value, of the monitor's gpuyard_quota_{guaranteed,used,borrowed}_gpus."""
    token = (platform.data_dir / METRICS_TOKEN_FILE).read_text().strip()
    headers = {"Authorization": f"Bearer {token}"}
    answer = httpx.get(f"http://127.0.0.1:{platform.monitor_port}/metrics", headers=headers, timeout=10)
    return {
        (family.name.removeprefix("gpuyard_quota_").removesuffix("_gpus"), s.labels["tenant"]): s.value
        for family in text_string_to_metric_families(answer.text)
        if family.name.startswith("gpuyard_quota_")
        for s in family.samples
    }


def test_the_api_and_the_metrics_say_the_same_of_each_tenants_quota(tmp_path):
    p = Platform(
        tmp_path / "data",
        tmp_path / "config",
        simulate_gpus=2,
        env={"GPUYARD_QUOTAS": "vision=1"},
        executors=1,
    ).start()
    jobs = []
    try:
        client = p.client()
        jobs.append(client.submit({**SLEEPER, "tenant": "vision"}).job_id)
        p.wait_state(jobs[-1], {"running"})
        jobs.append(
            client.submit({**SLEEPER, "tenant": "nlp"}).job_id
        )  # no guarantee: all it runs is borrowed
        p.wait_state(jobs[-1], {"running"})
        jobs.append(client.submit({**SLEEPER, "tenant": "nlp"}).job_id)  # no GPU left: it waits

        rows = {t["tenant"]: t for t in client.request("GET", "/v1/tenants")["items"]}
        assert set(rows) == {"vision", "nlp"}
        vision, nlp = rows["vision"], rows["nlp"]
        assert (vision["guaranteed_gpus"], vision["used_gpus"], vision["borrowed_gpus"]) == (1, 1, 0)
        assert (nlp["guaranteed_gpus"], nlp["used_gpus"], nlp["borrowed_gpus"]) == (0, 1, 1)
        assert (vision["running"], vision["queued"], nlp["running"], nlp["queued"]) == (1, 0, 1, 1)
        assert nlp["oldest_queued_seconds"] >= 0 and vision["oldest_queued_seconds"] is None

        expected = {
            ("guaranteed", "vision"): 1.0,
            ("used", "vision"): 1.0,
            ("borrowed", "vision"): 0.0,
            ("used", "nlp"): 1.0,
            ("borrowed", "nlp"): 1.0,
        }
        seen = wait_for(
            lambda: (m := quota_metrics(p)) and all(m.get(k) == v for k, v in expected.items()) and m,
            30,
            0.5,
            "the monitor's quota figures",
        )
        for (figure, tenant), value in expected.items():
            assert rows[tenant][f"{figure}_gpus"] == value == seen[figure, tenant]
    finally:
        for job_id in jobs:
            p.client().cancel(job_id)
        p.stop()
