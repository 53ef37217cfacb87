"""Every service's own /metrics through `gpuyard up --simulate-gpus 2`: the addresses it lists in the targets
file, each scraped and parsed as Prometheus would, with the events the scheduler's and the executors'
consumers handled for a few jobs, and each consumer's lag; `GET /v1/services` says each of those addresses; and
a consumer's lag against a real nats-server."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.shared.auth.secretfile import METRICS_TOKEN_FILE
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.bus.metrics import OUTCOMES, ConsumerLag
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSucceeded
from gpuyard.shared.contracts.events.subjects import EVENTS_STREAM
from gpuyard.shared.contracts.jobstate import JobState

from .conftest import Platform, wait_for
from .servicemetrics import ack_pending_of, handled, handling_count, lag_of, metrics_addresses
from .servicemetrics import scrape as scrape_with

pytestmark = pytest.mark.integration

JOBS = 3
EXECUTORS = ("executor", "executor-1")
MONITOR_WATCHES = ("monitor-alerts-telemetry", "monitor-alerts-node-lost")


@pytest.fixture(scope="module")
def metered(tmp_path_factory):
    base = tmp_path_factory.mktemp("metered")
    env = {"GPUYARD_CONSUMER_LAG_INTERVAL": "0.5"}  # the lag read twice a second: no waiting for it
    p = Platform(base / "data", base / "config", simulate_gpus=2, env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def test_each_service_serves_its_own_figures_with_its_consumers_counts_and_lag(metered):
    address = metrics_addresses(metered)
    assert set(address) == {"submit", "scheduler", "executor", "executor-1", "serving"}
    assert address["submit"] == f"127.0.0.1:{metered.port}"
    assert address["serving"] == f"127.0.0.1:{metered.serving_port}"
    address["monitor"] = f"127.0.0.1:{metered.monitor_port}"  # its own figures are in its /metrics
    token = (metered.data_dir / METRICS_TOKEN_FILE).read_text().strip()  # (Prometheus sends it to each)

    def scrape(where: str) -> dict[str, list]:
        return scrape_with(where, token)

    client = metered.client()
    jobs = [
        client.submit({"name": f"m{i}", "command": "true", "resources": {"gpus": 1}}) for i in range(JOBS)
    ]
    for job in jobs:
        metered.wait_state(job.job_id, {JobState.SUCCEEDED})

    for process, where in address.items():
        [info] = scrape(where)["gpuyard_service_info"]
        assert info.labels["service"] == process.split("-")[0], process
        assert scrape(where)["process_resident_memory_bytes"][0].value > 0

    # the scheduler's watch of job events saw each job submitted, started and ended: these jobs' events are the
    # only job events there are, and a watch sees each event of its subjects once
    followed = ("job.submitted", "job.started", "job.succeeded")
    # (the API answers from the store: the scheduler may see an end a moment later, and its lag is read twice a
    # second: it says 0 once every event of its subjects was delivered)
    scheduler = wait_for(
        lambda: (
            (s := scrape(address["scheduler"]))
            and all(handled(s, "scheduler-jobs", subject=subject) >= JOBS for subject in followed)
            and [lag.value for lag in lag_of(s, "scheduler-jobs")] == [0]
            and s
        ),
        20,
        what="the scheduler's counts of each job's events, and its lag once it has them all",
    )
    assert {subject: handled(scheduler, "scheduler-jobs", subject=subject) for subject in followed} == {
        subject: JOBS for subject in followed
    }
    every_outcome = sum(handled(scheduler, "scheduler-jobs", outcome) for outcome in OUTCOMES)
    assert every_outcome == handled(scheduler, "scheduler-jobs") == len(followed) * JOBS  # all ok
    assert handling_count(scheduler, "scheduler-jobs") == every_outcome  # one handling time for each
    [jobs_lag] = lag_of(scheduler, "scheduler-jobs")
    assert jobs_lag.labels["stream"] == EVENTS_STREAM.name
    heartbeats = handled(scheduler, "scheduler-heartbeats", subject="node.heartbeat")
    assert heartbeats >= 1 and handled(scheduler, "scheduler-heartbeats") == heartbeats  # the node's only

    # the executors share the node's placements: together they handled one per job
    def placements_handled() -> float:
        return sum(handled(scrape(address[p]), "executor-node-a", subject="job.placed") for p in EXECUTORS)

    wait_for(lambda: placements_handled() >= JOBS, 10, what="the executors' counts of the placements")
    assert placements_handled() == JOBS  # each placement to one of them, once
    # the lag of each one's consumers, read twice a second: every placement delivered and acknowledged
    for process in EXECUTORS:
        samples = wait_for(
            lambda process=process: (
                (s := scrape(address[process]))
                and [lag.value for lag in lag_of(s, "executor-node-a")] == [0]
                and [a.value for a in ack_pending_of(s, "executor-node-a")] == [0]
                and s
            ),
            20,
            what=f"the lag gauges of {process} to say every placement was delivered and acknowledged",
        )
        [placements] = lag_of(samples, "executor-node-a")
        assert placements.labels["stream"] == EVENTS_STREAM.name

    monitor = wait_for(  # its alert rules' consumer and watches, each by its name
        lambda: (
            (s := scrape(address["monitor"]))
            and all(lag_of(s, name) for name in ("monitor-alerts", *MONITOR_WATCHES))
            and handled(s, "monitor-alerts-telemetry", subject="gpu.sample") > 0
            and s
        ),
        10,
        what="the monitor's own figures",
    )
    assert "DCGM_FI_DEV_GPU_UTIL" in monitor  # with the GPUs' figures


def test_the_services_list_says_where_each_process_serves_its_figures(metered):
    """GET /v1/services gives each process's /metrics URL (its heartbeat's): the addresses scraped above."""
    scraped = [
        (process.split("-")[0], f"http://{where}/metrics")
        for process, where in metrics_addresses(metered).items()
    ]
    scraped.append(("monitor", f"http://127.0.0.1:{metered.monitor_port}/metrics"))
    client = metered.client()

    def listed() -> list[tuple[str, str | None]]:
        return sorted((s.service, s.metrics) for s in client.services() if s.state == "running")

    wait_for(  # (the API, the serving API and the monitor say theirs from their second heartbeat on)
        lambda: listed() == sorted(scraped), 20, 0.5, what=f"/v1/services to list {sorted(scraped)}"
    )


async def test_a_consumers_lag_is_what_jetstream_says_of_it(nats_url):
    """Against a real server: events a consumer holds unacknowledged, then none once its handler goes on; a
    watch's consumer is read under the watch's name."""
    bus = await Bus.connect([nats_url], name="lag", source="/test/lag")
    await bus.ensure_streams()
    release, started = asyncio.Event(), asyncio.Event()

    async def slow(event, msg):
        started.set()
        await release.wait()

    async def quick(event, msg):
        pass

    def lag(name: str, lags) -> ConsumerLag | None:
        return next((x for x in lags if x.consumer == name), None)

    try:
        await bus.consume("lagging", ["job.>"], slow, stream=EVENTS_STREAM.name, batch=4)
        await bus.watch("job.>", quick, stream=EVENTS_STREAM.name, name="watching")
        for i in range(3):
            await bus.publish(make_event(JobSucceeded(job_id=f"j{i}", attempt=1), source="/test"), tenant="t")
        await asyncio.wait_for(started.wait(), 10)
        held = lag("lagging", await bus.consumer_lags())
        assert held is not None and held.stream == EVENTS_STREAM.name
        assert held.pending + held.ack_pending == 3 and held.ack_pending >= 1  # one handled at a time
        assert lag("watching", await bus.consumer_lags()) is not None
        release.set()
        async with asyncio.timeout(10):
            while (x := lag("lagging", await bus.consumer_lags())) is None or x.pending + x.ack_pending:  # noqa: ASYNC110 - the server's figure
                await asyncio.sleep(0.05)  # acks leave a moment after each handling
        assert bus.metrics.consumers["lagging"].counts == {("job.succeeded.t", "ok"): 3}
    finally:
        release.set()
        await bus.close()
