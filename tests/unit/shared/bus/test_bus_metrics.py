"""The bus figures of each service (`gpuyard.shared.bus.metrics`), counted in the bus's consumer loops (`gpuyard.shared.bus.consumers`, `watches`): a
message through a durable consumer or a watch counts once, with its outcome and handling time; a consumer's
lag follows its consumer info; and every service's /metrics serves them (its own port, the submit API's)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.shared.bus.consumers import PullConsumer
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.bus.metrics import BusMetrics, subject_label
from gpuyard.shared.bus.watches import Watch
from gpuyard.shared.contracts.events.envelope import make_event, subject_of
from gpuyard.shared.contracts.events.jobs import JobCancelRequested
from gpuyard.shared.runtime.servicemetrics import MetricsServer, render, service_registry
from tests.unit.shared.bus.bus_fakes import FakeBus, FakeMsg

HANDLED = "gpuyard_bus_events_handled_total"


def cancel_msg(job: str = "j1", tenant: str = "vision", *, delivered: int = 1, seq: int = 1) -> FakeMsg:
    event = make_event(JobCancelRequested(job_id=job, by="ana"), source="/test")
    return FakeMsg(subject_of(event, tenant), event.to_json(), delivered=delivered, seq=seq)


def handled(metrics: BusMetrics, consumer: str, outcome: str, subject: str = "job.cancel_requested") -> float:
    value = metrics.registry.get_sample_value(
        HANDLED, {"consumer": consumer, "subject": subject, "outcome": outcome}
    )
    return value or 0.0


def handling_count(metrics: BusMetrics, consumer: str) -> float:
    value = metrics.registry.get_sample_value(
        "gpuyard_bus_event_handling_seconds_count", {"consumer": consumer}
    )
    return value or 0.0


def consumer(bus: FakeBus, handler, *, wanted=None, max_deliver: int = 3) -> PullConsumer:
    return PullConsumer(
        bus, "EVENTS", "executor-n1", handler, max_deliver=max_deliver, batch=8, wanted=wanted
    )


async def until_acked(msg: FakeMsg) -> None:
    await asyncio.wait_for(msg.ack_seen.wait(), 5)  # acks leave together a moment later (ACK_DELAY)


@pytest.mark.parametrize(
    ("subject", "label"),
    [
        ("job.placed.vision", "job.placed"),
        ("job.placed", "job.placed"),
        ("node.heartbeat", "node.heartbeat"),
        ("alert.raised", "alert.raised"),
        ("deadletter", "deadletter"),
    ],
)
def test_a_subject_is_counted_without_its_tenant(subject, label):
    assert subject_label(subject) == label


async def test_a_handled_event_counts_once_as_ok_with_its_handling_time():
    bus = FakeBus()
    seen = []

    async def handler(event, msg):
        seen.append(event.data.job_id)

    pull = consumer(bus, handler)
    for i in range(3):
        msg = cancel_msg(f"j{i}", tenant=("vision", "nlp", "vision")[i], seq=i + 1)
        await pull.dispatch(msg)
        await until_acked(msg)
    assert seen == ["j0", "j1", "j2"]
    assert handled(bus.metrics, "executor-n1", "ok") == 3  # both tenants under one subject
    assert handling_count(bus.metrics, "executor-n1") == 3
    assert handled(bus.metrics, "executor-n1", "redelivered") == 0


async def test_a_failing_handler_counts_redelivered_then_dead_lettered_at_the_last_delivery():
    bus = FakeBus()

    async def handler(event, msg):
        raise RuntimeError("the store is away")

    pull = consumer(bus, handler, max_deliver=3)
    for delivered in (1, 2):
        msg = cancel_msg(delivered=delivered)
        await pull.dispatch(msg)
        assert msg.naked == 1 and not msg.termed
    assert handled(bus.metrics, "executor-n1", "redelivered") == 2
    last = cancel_msg(delivered=3)
    await pull.dispatch(last)
    assert last.termed == 1 and bus.dead == [("executor-n1", "RuntimeError: the store is away")]
    assert handled(bus.metrics, "executor-n1", "dead_lettered") == 1
    assert handled(bus.metrics, "executor-n1", "ok") == 0
    assert handling_count(bus.metrics, "executor-n1") == 3  # a failed handling took time too


async def test_an_unreadable_event_counts_dead_lettered_and_a_skipped_one_skipped():
    bus = FakeBus()

    async def handler(event, msg):
        raise AssertionError("never called")

    pull = consumer(bus, handler, wanted=lambda msg: msg.subject != "job.cancel_requested.nlp")
    garbage = FakeMsg("job.cancel_requested.vision", b"{not json")
    await pull.dispatch(garbage)
    assert garbage.termed == 1 and len(bus.dead) == 1
    assert handled(bus.metrics, "executor-n1", "dead_lettered") == 1
    other = cancel_msg(tenant="nlp")
    await pull.dispatch(other)  # passed over undecoded, acknowledged
    await until_acked(other)
    assert handled(bus.metrics, "executor-n1", "skipped") == 1
    assert handling_count(bus.metrics, "executor-n1") == 0  # no handler ran


async def test_a_watch_counts_what_it_handles_under_its_name():
    bus = FakeBus()
    calls = []

    async def handler(event, msg):
        calls.append(event.data.job_id)
        if event.data.job_id == "bad":
            raise ValueError("no")

    watch = Watch(
        bus,
        "EVENTS",
        ["job.cancel_requested.*"],
        handler,
        since=None,
        wanted=lambda msg: not msg.subject.endswith(".nlp"),
        name="scheduler-jobs",
    )
    for seq, msg in enumerate(
        [cancel_msg("a"), cancel_msg("bad"), cancel_msg("c", tenant="nlp"), cancel_msg("d")], start=1
    ):
        msg.metadata.sequence = SimpleNamespace(stream=seq, consumer=seq)
        await watch._delivered(msg)
    assert calls == ["a", "bad", "d"]
    assert handled(bus.metrics, "scheduler-jobs", "ok") == 2
    assert handled(bus.metrics, "scheduler-jobs", "failed") == 1
    assert handled(bus.metrics, "scheduler-jobs", "skipped") == 1
    assert handling_count(bus.metrics, "scheduler-jobs") == 3
    unnamed = Watch(bus, "EVENTS", ["node.heartbeat"], handler, since=None)
    assert unnamed.figures.name == "watch:node.heartbeat"


class InfoJs:
    """`consumer_info` answers from a table; a name not in it is an error (NATS away, say)."""

    def __init__(self):
        self.infos: dict[str, SimpleNamespace] = {}

    async def consumer_info(self, stream: str, name: str, **_):
        if name not in self.infos:
            raise TimeoutError("nats: timeout")
        return self.infos[name]


def lag_gauges(metrics: BusMetrics) -> dict[tuple[str, str], float]:
    text = render(metrics.registry).decode()
    return {
        (sample.name, sample.labels["consumer"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("gpuyard_bus_consumer_")
        for sample in family.samples
    }


async def test_a_consumers_lag_gauge_follows_its_consumer_info():
    js = InfoJs()
    bus = Bus(SimpleNamespace(jetstream=lambda: js), "/test")
    pull = PullConsumer(bus, "EVENTS", "executor-n1", None, max_deliver=5, batch=8)
    watch = Watch(bus, "TELEMETRY", ["node.heartbeat"], None, since=None, name="scheduler-heartbeats")
    bus._consumers += [pull, watch]  # as consume() and watch() record them
    watch.consumer_name = "ephemeral-1"  # the server's name of the watch's current consumer
    js.infos["executor-n1"] = SimpleNamespace(num_pending=7, num_ack_pending=2, num_redelivered=1)
    js.infos["ephemeral-1"] = SimpleNamespace(num_pending=3, num_ack_pending=0, num_redelivered=0)

    bus.metrics.lags = tuple(await bus.consumer_lags())
    gauges = lag_gauges(bus.metrics)
    assert gauges[("gpuyard_bus_consumer_pending_messages", "executor-n1")] == 7
    assert gauges[("gpuyard_bus_consumer_ack_pending_messages", "executor-n1")] == 2
    assert gauges[("gpuyard_bus_consumer_redelivered_messages", "executor-n1")] == 1
    assert gauges[("gpuyard_bus_consumer_pending_messages", "scheduler-heartbeats")] == 3

    js.infos["executor-n1"] = SimpleNamespace(num_pending=0, num_ack_pending=0, num_redelivered=0)
    del js.infos["ephemeral-1"]  # its info cannot be read now: no figure rather than a stale one
    bus.metrics.lags = tuple(await bus.consumer_lags())
    gauges = lag_gauges(bus.metrics)
    assert gauges[("gpuyard_bus_consumer_pending_messages", "executor-n1")] == 0
    assert ("gpuyard_bus_consumer_pending_messages", "scheduler-heartbeats") not in gauges


def families(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_a_service_registry_has_who_it_is_the_process_and_the_bus_figures():
    registry = service_registry("scheduler", "host-1", "1.2.3")
    BusMetrics(registry).consumer("scheduler-jobs").count("job.placed.vision", "ok")
    found = families(render(registry).decode())
    [info] = found["gpuyard_service_info"]
    assert (
        info.labels == {"service": "scheduler", "instance": "host-1", "version": "1.2.3"} and info.value == 1
    )
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds"} <= set(found)
    [count] = found["gpuyard_bus_events_handled"]
    assert count.labels == {"consumer": "scheduler-jobs", "subject": "job.placed", "outcome": "ok"}


async def test_the_metrics_port_serves_the_registry_and_nothing_else():
    registry = service_registry("executor", "host-2", "1.2.3")
    server = MetricsServer(registry, "127.0.0.1", 0).start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}", timeout=5) as client:
            answer = await client.get("/metrics")
            missing = await client.get("/healthz")
    finally:
        await asyncio.to_thread(server.stop)
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    assert families(answer.text)["gpuyard_service_info"][0].labels["service"] == "executor"
    assert missing.status_code == 404


def test_the_submit_api_serves_its_figures_without_a_token_and_outside_its_openapi_document():
    from gpuyard.services.submit.app import create_app

    registry = service_registry("submit", "host-3", "1.2.3")
    metrics = BusMetrics(registry)
    ctx = SimpleNamespace(
        max_body_bytes=1024,
        max_model_bytes=1024,
        bus=SimpleNamespace(metrics=metrics),
        volume_metrics=None,
        scrape=None,
    )
    with TestClient(create_app(ctx)) as api:
        answer = api.get("/metrics")
        paths = api.get("/openapi.json").json()["paths"]
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/plain")
    assert families(answer.text)["gpuyard_service_info"][0].labels["service"] == "submit"
    assert "/metrics" not in paths


def test_the_handling_times_render_as_a_cumulative_histogram_per_consumer():
    metrics = BusMetrics()
    figures = metrics.consumer("executor-n1")
    for seconds in (0.0001, 0.0005, 0.003, 0.003, 20.0):  # 0.0005 is in the bucket of le="0.0005"
        figures.observe(seconds)
    assert metrics.consumer("executor-n1") is figures  # opened again under its name: the same figures
    [family] = [
        f for f in text_string_to_metric_families(render(metrics.registry).decode()) if f.type == "histogram"
    ]
    buckets = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
    assert (buckets["0.0005"], buckets["0.001"], buckets["0.0025"], buckets["0.005"]) == (2, 2, 2, 4)
    assert (buckets["10"], buckets["+Inf"]) == (4, 5)
    [total] = [s.value for s in family.samples if s.name.endswith("_sum")]
    [count] = [s.value for s in family.samples if s.name.endswith("_count")]
    assert count == 5 and total == pytest.approx(20.0066)
