"""deploy/: the Grafana dashboard queries only series the monitor's /metrics has, and the Prometheus scrape
config targets the monitor's port and the pods the DaemonSet annotates."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.metrics import make_registry
from gpuyard.services.monitor.platform import PlatformFigures, PlatformSnapshot, TenantQueue, TenantQuota
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading, GpuSample
from gpuyard.shared.settings.monitor import MonitorSettings
from tests.unit.services.monitor.grafana import queried_metrics

ROOT = Path(__file__).resolve().parents[4]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuyard-dashboard.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
MONITOR = ROOT / "deploy" / "kubernetes" / "base" / "monitor.yaml"


def exported_names() -> set[str]:
    """Every sample name /metrics has when every figure is known."""
    ingest = SampleIngest()
    reading = GpuReading(
        index=0,
        uuid="GPU-0",
        utilization_pct=1,
        memory_util_pct=1,
        memory_used_bytes=1,
        memory_total_bytes=2,
        temperature_c=1,
        power_w=1,
        power_limit_w=1,
        sm_clock_mhz=1,
        memory_clock_mhz=1,
        ecc_corrected=0,
        ecc_uncorrected=0,
        last_xid=79,
        holders=[GpuHolder(job_id="j", tenant="t")],
    )
    ingest.ingest(make_event(GpuSample(node="n", gpus=[reading]), source="/test"))
    figures = PlatformFigures({"t": 1})
    figures.snapshot = PlatformSnapshot(
        {("queued", "t"): 1},
        {"t": TenantQueue(1, 1.0)},
        {"t": TenantQuota(1, 1, 0)},
        {("failed", "t"): 1},
        datetime.now(UTC),
    )
    text = generate_latest(make_registry(ingest, figures)).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_dashboard_queries_only_what_the_monitor_exports():
    dashboard = json.loads(DASHBOARD.read_text())
    used = queried_metrics(dashboard, "DCGM_FI_", "gpuyard_")
    assert {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_POWER_USAGE",
    } <= used
    assert {"gpuyard_jobs", "gpuyard_queue_length"} <= used
    assert used <= exported_names(), used - exported_names()
    titles = " ".join(p["title"] for p in dashboard["panels"])
    assert "holder" in titles and "Jobs by state" in titles and "Queue" in titles
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def test_the_scrape_config_targets_the_monitor():
    config = yaml.safe_load(PROMETHEUS.read_text())
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    port = MonitorSettings.model_fields["metrics_port"].default
    assert jobs["gpuyard-monitor"]["static_configs"][0]["targets"] == [f"127.0.0.1:{port}"]
    pods = jobs["gpuyard-monitor-pods"]
    kept = [r["regex"] for r in pods["relabel_configs"] if r.get("action") == "keep"]
    template = yaml.safe_load(MONITOR.read_text())["spec"]["template"]
    assert template["metadata"]["labels"]["app.kubernetes.io/name"] in kept
    assert template["metadata"]["annotations"]["prometheus.io/scrape"] in kept
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert env["GPUYARD_METRICS_HOST"] == "0.0.0.0" and env["GPUYARD_METRICS_SCOPE"] == "node"
    assert (
        template["metadata"]["annotations"]["prometheus.io/port"] == env["GPUYARD_METRICS_PORT"] == str(port)
    )
