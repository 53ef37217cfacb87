"""Where each service's own /metrics is: `gpuyard up` gives the scheduler and each executor a port of their own
and lists every service's address in the targets file; the serving API adds the service's figures to its
/metrics; the scrape config reads that file; the services' dashboard queries only what the services export."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.cli import build_parser
from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.metrics import make_registry
from gpuyard.services.serving.access import Access
from gpuyard.services.serving.entry import create_entry_app
from gpuyard.services.serving.proxy import Forwarder
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Routes
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.bus.metrics import OUTCOMES, BusMetrics, ConsumerLag
from gpuyard.shared.runtime.servicemetrics import render, service_registry
from gpuyard.supervisor.banner import metrics_line
from gpuyard.supervisor.options import UpOptions
from gpuyard.supervisor.plan import plan
from gpuyard.supervisor.scrapeconfig import TARGETS_FILE, write_metrics_targets
from tests.unit.services.monitor.grafana import queried_metrics

ROOT = Path(__file__).resolve().parents[4]
DASHBOARD = ROOT / "deploy" / "grafana" / "gpuyard-services-dashboard.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"


def up_plan(tmp_path: Path, *flags: str, executors: int = 3):
    args = build_parser().parse_args(
        ["up", "--data-dir", str(tmp_path), *flags, "--executors", str(executors)]
    )
    return plan(UpOptions.from_args(args), dict(os.environ))


def own_ports(platform) -> dict[str, int | None]:
    return {c.name: platform.settings[c.name].service_metrics_port for c in platform.children}


def test_up_gives_the_scheduler_and_each_executor_a_free_port_of_their_own(tmp_path):
    ports = own_ports(up_plan(tmp_path))
    own = [ports[name] for name in ("scheduler", "executor", "executor-1", "executor-2")]
    assert all(own) and len(set(own)) == 4  # free ports, each its own: several executors on one machine
    assert ports["submit"] is ports["serving"] is ports["monitor"] is None  # theirs is on their HTTP port


def test_up_gives_each_process_a_health_port_of_its_own_apart_from_every_other_port(tmp_path):
    platform = up_plan(tmp_path, "--port", "40000", executors=3)
    settings = [platform.settings[c.name] for c in platform.children]
    health = [s.health_port for s in settings]
    metrics = {s.service_metrics_port for s in settings} - {None}
    named = {40000, 4222, 8000, 9400}  # the API's (in the ephemeral range), NATS', serving's, the monitor's
    assert len(health) == 7 and all(health) and len(set(health)) == 7  # none left to port 0
    assert not set(health) & (metrics | named)


def test_up_leaves_the_health_port_to_the_environment_that_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYARD_HEALTH_PORT", "0")
    args = build_parser().parse_args(["up", "--data-dir", str(tmp_path), "--executors", "2"])
    platform = plan(UpOptions.from_args(args), dict(os.environ))
    assert {platform.settings[c.name].health_port for c in platform.children} == {0}


def test_up_takes_the_ports_from_a_first_port_when_asked(tmp_path):
    ports = own_ports(up_plan(tmp_path, "--service-metrics-port", "19500", executors=2))
    assert (ports["scheduler"], ports["executor"], ports["executor-1"]) == (19500, 19501, 19502)


def test_the_targets_file_lists_each_process_once_but_the_monitor(tmp_path):
    platform = up_plan(
        tmp_path, "--port", "18080", "--serving-port", "18000", "--service-metrics-port", "19500", executors=2
    )
    path = write_metrics_targets(platform)
    assert path == tmp_path.resolve() / TARGETS_FILE
    targets = {t["labels"]["process"]: t["targets"] for t in json.loads(path.read_text())}
    assert targets == {
        "submit": ["127.0.0.1:18080"],
        "scheduler": ["127.0.0.1:19500"],
        "executor": ["127.0.0.1:19501"],
        "executor-1": ["127.0.0.1:19502"],
        "serving": ["127.0.0.1:18000"],
    }  # the monitor's /metrics has a scrape job of its own
    line = metrics_line(platform)
    assert "scheduler 127.0.0.1:19500" in line and "monitor 127.0.0.1:9400" in line


class NoModels:
    async def get(self, tenant: str, name: str) -> None:
        return None


async def test_the_serving_api_serves_the_services_figures_after_the_models():
    registry, routes = ModelRegistry(), Routes("n1")
    figures = service_registry("serving", "host-1", "1.2.3")
    BusMetrics(figures).consumer("serving-n1").count("job.placed.vision", "ok")
    app = create_entry_app(
        registry,
        Access(Tokens(None, "tok=vision:ana"), NoModels(), registry, routes),
        Forwarder(registry, routes),
        service_metrics=figures,
    )
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        answer = await client.get("/metrics")
    found = {f.name for f in text_string_to_metric_families(answer.text)}
    assert {"gpuyard_inference_requests", "gpuyard_service_info", "gpuyard_bus_events_handled"} <= found
    assert "process_resident_memory_bytes" in found


def test_the_monitors_metrics_serve_its_own_figures_after_the_gpus():
    figures = service_registry("monitor", "host-1", "1.2.3")
    BusMetrics(figures).consumer("monitor-alerts").count("alert.raised", "ok")
    text = render(make_registry(SampleIngest(), None, service=figures)).decode()
    found = {f.name for f in text_string_to_metric_families(text)}
    assert {"gpuyard_monitor_samples_ingested", "gpuyard_service_info", "gpuyard_bus_events_handled"} <= found


def test_the_scrape_config_reads_the_targets_file_and_the_annotated_service_pods():
    jobs = {j["job_name"]: j for j in yaml.safe_load(PROMETHEUS.read_text())["scrape_configs"]}
    [files] = [c["files"] for c in jobs["gpuyard-services"]["file_sd_configs"]]
    assert [Path(f).name for f in files] == [TARGETS_FILE]
    pods = jobs["gpuyard-service-pods"]["relabel_configs"]
    assert {"action": "drop", "regex": "gpuyard-monitor"}.items() <= next(
        r for r in pods if r.get("action") == "drop"
    ).items()  # the monitor's pods have their own job: no process scraped twice
    assert any(r.get("regex") == "gpuyard" and r.get("action") == "keep" for r in pods)


def exported_names() -> set[str]:
    """Every sample name a service's /metrics has once each of its figures is known."""
    registry = service_registry("executor", "host-1", "1.2.3")
    metrics = BusMetrics(registry)
    figures = metrics.consumer("executor-n1")
    for outcome in OUTCOMES:
        figures.count("job.placed.vision", outcome)
    figures.observe(0.01)
    metrics.lags = (ConsumerLag("executor-n1", "EVENTS", 1, 1, 1),)
    text = render(registry).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_the_services_dashboard_queries_only_what_the_services_export():
    dashboard = json.loads(DASHBOARD.read_text())
    used = queried_metrics(dashboard, "gpuyard_", "process_")
    assert {
        "gpuyard_bus_events_handled_total",
        "gpuyard_bus_consumer_pending_messages",
        "gpuyard_bus_event_handling_seconds_bucket",
        "process_cpu_seconds_total",
    } <= used
    assert used <= exported_names(), used - exported_names()
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    titles = " ".join(p["title"] for p in dashboard["panels"])
    assert "Events handled" in titles and "lag" in titles
