"""Where each service process's /metrics is: its heartbeat says (`ServiceHeartbeat.metrics`), from its own
/metrics port or the one its service serves its figures on, and `GET /v1/services` lists it; a heartbeat of
version 1 (none said) reads as one that serves none."""

from __future__ import annotations

import json
import socket
from datetime import UTC, datetime

import httpx
import pytest

from gpuyard.services.submit import telemetry
from gpuyard.shared.contracts.events.envelope import CloudEvent, make_event
from gpuyard.shared.contracts.events.services import ServiceHeartbeat
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.runtime.service import Service, metrics_url
from gpuyard.shared.settings.common import CommonSettings


@pytest.fixture
def own_port():
    """A service with a /metrics port of its own (0: a free one), stopped after the test."""
    service = Service("scheduler", CommonSettings(service_metrics_port=0))
    service.serve_metrics()
    yield service
    if service.metrics_server is not None:
        service.metrics_server.stop()


def test_a_heartbeat_says_the_url_of_the_processs_own_metrics_port_which_serves_its_figures(own_port):
    said = own_port.heartbeat().metrics
    assert said == f"http://127.0.0.1:{own_port.metrics_server.port}/metrics"
    scraped = httpx.get(said, timeout=10).raise_for_status().text
    assert 'gpuyard_service_info{instance="' in scraped and 'service="scheduler"' in scraped


def test_its_own_port_is_said_rather_than_where_its_service_also_serves_its_figures(own_port):
    own = own_port.heartbeat().metrics
    own_port.metrics_served_on("127.0.0.1", 8080)
    assert own_port.heartbeat().metrics == own


def test_a_service_without_a_port_of_its_own_says_where_it_serves_its_figures_once_it_does():
    service = Service("submit", CommonSettings())
    assert service.heartbeat().metrics is None
    service.metrics_served_on("127.0.0.1", 8080)
    assert service.heartbeat().metrics == "http://127.0.0.1:8080/metrics"


def test_a_port_that_is_taken_is_not_said(own_port):
    taken = own_port.metrics_server.port
    other = Service("executor", CommonSettings(service_metrics_port=taken))
    other.serve_metrics()  # said in the log; the service goes on without it
    assert other.metrics_server is None and other.heartbeat().metrics is None


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("10.0.0.7", "http://10.0.0.7:9410/metrics"),
        ("0.0.0.0", f"http://{socket.gethostname()}:9410/metrics"),
        ("::", f"http://{socket.gethostname()}:9410/metrics"),
        ("fd00::7", "http://[fd00::7]:9410/metrics"),
    ],
)
def test_the_url_names_the_listening_address_or_this_hosts_name_when_it_listens_on_every_one(host, url):
    assert metrics_url(host, 9410) == url


def heartbeat(pid: int = 10, **more) -> ServiceHeartbeat:
    return ServiceHeartbeat(
        service="scheduler",
        instance=f"h-{pid}",
        pid=pid,
        host="h",
        started_at=datetime.now(UTC),
        version="1.0",
        **more,
    )


def test_a_version_1_heartbeat_reads_as_one_without_metrics():
    raw = json.loads(make_event(heartbeat(metrics="http://h:9410/metrics"), source="/t").to_json())
    assert raw["dataversion"] == 2
    del raw["data"]["metrics"], raw["dataversion"]  # as a service of the release before sent it
    read = CloudEvent.from_json(json.dumps(raw).encode())
    assert read.type == f"io.gpuyard.{Subject.SERVICE_HEARTBEAT}"
    assert read.dataversion == 2 and read.data.metrics is None


def test_the_services_list_gives_each_processs_metrics_url():
    seen = telemetry.Telemetry()
    seen.observe(make_event(heartbeat(metrics="http://h:9410/metrics"), source="/t"))
    seen.observe(make_event(heartbeat(11), source="/t"))
    assert {s.pid: s.metrics for s in seen.service_list()} == {10: "http://h:9410/metrics", 11: None}
