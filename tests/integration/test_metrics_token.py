"""The monitor's and the serving entry point's /metrics, as real service processes sharing a data dir: without
the scrape token (which the first of them to start makes, `secrets/metrics.token`) they answer 401 and nothing
of their figures; with it, as Prometheus sends it, 200; their health endpoints stay open."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gpuyard.shared.auth.secretfile import METRICS_TOKEN_FILE

from .conftest import free_ports, wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def answer(url: str, **headers: str) -> int | None:
    try:
        return httpx.get(url, headers=headers, timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_metrics_answer_401_without_the_scrape_token_and_200_with_it(nats_url, tmp_path):
    data = tmp_path / "data"
    monitor_health, metrics_port, serving_health, serving_port = free_ports(4)
    common = ["--nats-url", nats_url, "--data-dir", str(data)]
    argvs = {
        "monitor": [*common, "--health-port", str(monitor_health), "--metrics-port", str(metrics_port)],
        "serving": [*common, "--health-port", str(serving_health), "--serving-port", str(serving_port)],
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPUYARD_SIMULATE_GPUS": "1"}
    procs = []
    try:
        for service, argv in argvs.items():
            log = (tmp_path / f"{service}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", f"gpuyard.services.{service}", *argv],
                    env=env,
                    cwd=ROOT,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
        for port in (monitor_health, serving_health):
            wait_for(lambda port=port: answer(f"http://127.0.0.1:{port}/readyz") == 200, 60, what="ready")
        token = (data / METRICS_TOKEN_FILE).read_text().strip()
        assert (data / METRICS_TOKEN_FILE).stat().st_mode & 0o077 == 0
        for url, figure in (
            (f"http://127.0.0.1:{metrics_port}/metrics", "DCGM_FI_DEV_GPU_UTIL"),
            (f"http://127.0.0.1:{serving_port}/metrics", "gpuyard_inference_requests_total"),
        ):
            refused = httpx.get(url, timeout=10)
            assert refused.status_code == 401 and figure not in refused.text, url
            assert refused.headers["www-authenticate"].startswith("Bearer")
            assert answer(url, Authorization="Bearer not-the-token") == 401
            scraped = wait_for(
                lambda url=url, figure=figure: (
                    (r := httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10))
                    and r.status_code == 200
                    and figure in r.text
                ),
                30,
                what=f"{url} with the token",
            )
            assert scraped
        for port in (monitor_health, serving_health):  # (no token asked there)
            assert answer(f"http://127.0.0.1:{port}/healthz") == 200
        assert answer(f"http://127.0.0.1:{serving_port}/v2/health/live") == 200
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
