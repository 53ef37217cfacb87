"""The bus with users (`gpuyard up`'s nats-server configuration, `gpuyard.supervisor.busconfig`): a real nats-server run
with the generated configuration refuses anonymous clients and keeps each service to its own subjects; the
platform works end to end with it, and forged events change nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import stat
import subprocess
from pathlib import Path

import nats
import pytest

from gpuyard.shared.bus.credentials import bus_dir, credentials_path, ensure_credentials, read_credentials
from gpuyard.shared.bus.jetstream import Bus, BusRefused
from gpuyard.shared.bus.permissions import Role
from gpuyard.shared.contracts.events.envelope import CloudEvent, make_event
from gpuyard.shared.contracts.events.jobs import JobCancelRequested, JobPlaced, ReplicaPlacement
from gpuyard.shared.contracts.events.subjects import (
    EVENTS_STREAM,
    JOB_SUBJECTS,
    Subject,
    Wildcard,
    subject_filter,
    tenant_wildcard,
)
from gpuyard.supervisor.busconfig import CONFIG_FILE, write_config

from .conftest import BIN, free_port, wait_for
from .witness import acknowledged

pytestmark = pytest.mark.integration
TENANT = "vision"
EXECUTOR_CONTROL_DURABLES = ("executor-node-a-0", "executor-node-a-1")
"""The control events' durable consumer of each of node-a's two executor processes (cancels, ends)."""


@pytest.fixture
def secured(tmp_path):
    """A nats-server with JetStream run with the configuration `gpuyard up` writes: (url, data dir)."""
    data_dir = tmp_path / "data"
    config = write_config(data_dir)
    port = free_port()
    proc = subprocess.Popen(
        [str(BIN / "nats-server"), "-c", str(config), "-js", "-sd", str(tmp_path / "nats")]
        + ["-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"nats://127.0.0.1:{port}"

    def listening():
        import socket

        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_for(listening, 10, what="nats-server")
    yield url, data_dir
    proc.terminate()
    proc.wait(10)


class Errors:
    """The asynchronous errors the server sends a client (permission violations come this way)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, exc: Exception) -> None:
        self.seen.append(str(exc))

    def violations(self) -> list[str]:
        return [e for e in self.seen if "permissions violation" in e.lower()]


async def connect(url: str, data_dir, role: Role) -> tuple[Bus, Errors]:
    bus = await Bus.connect(
        [url],
        name=f"test-{role}",
        source="/test",
        credentials=read_credentials(credentials_path(data_dir, role)),
    )
    errors = Errors()
    bus.nc._error_cb = errors  # (Bus.connect's own logs them; the test wants to see them)
    return bus, errors


async def eventually(check, within: float = 5, what: str = "condition"):
    """`wait_for` that lets the event loop run (the server's errors arrive on it)."""
    for _ in range(int(within / 0.05)):
        if value := check():
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out after {within}s waiting for {what}")


def placement(job_id: str = "j1"):
    data = JobPlaced(job_id=job_id, attempt=1, placements=[ReplicaPlacement(replica=0, node="n")])
    return make_event(data, source="/test")


async def stored_count(bus: Bus) -> int:
    return (await bus.js.stream_info(EVENTS_STREAM.name)).state.messages


async def test_an_anonymous_client_is_refused(secured):
    url, _ = secured
    with pytest.raises(BusRefused, match="anonymous"):
        await Bus.connect([url], name="anonymous", source="/test", connect_timeout=2)
    with pytest.raises(Exception, match="(?i)authorization"):
        await nats.connect(url, connect_timeout=2, max_reconnect_attempts=0, allow_reconnect=False)


async def test_a_wrong_password_is_refused(secured, tmp_path):
    url, data_dir = secured
    wrong = ensure_credentials(tmp_path / "elsewhere", ["executor"])["executor"]  # same user, other password
    with pytest.raises(BusRefused, match="'executor'"):
        await Bus.connect([url], name="wrong", source="/test", credentials=wrong, connect_timeout=2)


async def test_the_executor_cannot_publish_a_placement_but_the_scheduler_can(secured):
    url, data_dir = secured
    executor, errors = await connect(url, data_dir, Role.EXECUTOR)
    scheduler, _ = await connect(url, data_dir, Role.SCHEDULER)
    try:
        await executor.ensure_streams()  # every service declares the streams at start-up
        with pytest.raises(Exception):  # noqa: B017 (no ack comes: nats-py times out)
            await asyncio.wait_for(executor.publish(placement("forged"), tenant=TENANT), 3)
        await eventually(errors.violations, what="the permissions violation")
        assert Subject.JOB_PLACED.value in errors.violations()[0]
        assert await stored_count(executor) == 0
        published = await scheduler.publish(placement("real"), tenant=TENANT)
        assert published.stream == EVENTS_STREAM.name and await stored_count(scheduler) == 1
    finally:
        await executor.close()
        await scheduler.close()


async def test_the_executor_cannot_listen_outside_its_permissions(secured):
    url, data_dir = secured
    executor, errors = await connect(url, data_dir, Role.EXECUTOR)
    try:

        async def ignore(msg) -> None:
            pass

        await executor.subscribe(Wildcard.JOB.value, ignore)
        await executor.subscribe("_INBOX.scheduler.>", ignore)  # another's replies
        await executor.nc.flush()
        await eventually(lambda: len(errors.violations()) >= 2, what="two permissions violations")
        assert "subscription" in " ".join(errors.violations()).lower()
    finally:
        await executor.close()


async def test_the_integrator_reads_every_event_and_publishes_none(secured):
    url, data_dir = secured
    integrator, errors = await connect(url, data_dir, Role.INTEGRATOR)
    scheduler, _ = await connect(url, data_dir, Role.SCHEDULER)
    seen: list[str] = []

    async def on_msg(msg) -> None:
        seen.append(msg.subject)

    try:
        await scheduler.ensure_streams()
        await integrator.subscribe(Wildcard.JOB.value, on_msg)
        await integrator.nc.flush()
        for n in range(5):  # core subscriptions are at most once: one of a few events arrives
            await scheduler.publish(placement(f"j{n}"), tenant=TENANT)
            with contextlib.suppress(AssertionError):
                await eventually(lambda: seen, 1, "an event")
                break
        assert seen and set(seen) == {subject_filter(Subject.JOB_PLACED, TENANT)}
        await integrator.nc.publish(Subject.JOB_CANCEL_REQUESTED.value, b"{}")
        await integrator.nc.flush()
        await eventually(errors.violations, what="the permissions violation")
        assert await stored_count(scheduler) == n + 1  # the scheduler's events only
    finally:
        await integrator.close()
        await scheduler.close()


def test_credentials_are_private_and_made_once(tmp_path):
    data_dir = tmp_path / "data"
    config = write_config(data_dir)
    first = {r: read_credentials(credentials_path(data_dir, r)) for r in Role}
    assert stat.S_IMODE(bus_dir(data_dir).stat().st_mode) == 0o700
    for path in [config, *(credentials_path(data_dir, r) for r in Role)]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert config.name == CONFIG_FILE and len({c.password for c in first.values()}) == len(Role)
    write_config(data_dir)  # the next start
    assert {r: read_credentials(credentials_path(data_dir, r)) for r in Role} == first
    assert "no_auth_user" not in config.read_text()


# ------------------------------------------------------------------ the platform, with its users


def test_the_platform_runs_a_job_with_users_on_the_bus(platform):
    assert stat.S_IMODE(platform.credentials("executor").stat().st_mode) == 0o600
    client = platform.client()
    job_id = client.submit({"command": "env", "resources": {"gpus": 1}}).job_id
    platform.wait_state(job_id, {"succeeded"})
    printed = client.logs(job_id)
    assert "GPUYARD_JOB_ID=" in printed
    assert (
        "GPUYARD_NATS" not in printed
        and read_credentials(platform.credentials("executor")).password not in printed
    )
    nats_log = (platform.data_dir / "logs" / "nats.log").read_text()
    assert "Violation" not in nats_log and "Violation" not in platform.log.read_text(), nats_log[-3000:]


def test_a_forged_cancel_request_leaves_a_running_job_running(platform, tmp_path):
    client = platform.client()
    pidfile = tmp_path / "pid"
    job_id = client.submit(
        {"command": f"echo $$ > {pidfile}; exec sleep 300", "resources": {"gpus": 1}}
    ).job_id
    platform.wait_state(job_id, {"running"})
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, what="the job's pid"))

    async def forge() -> None:
        bus = await platform.bus("submit")  # even a user that may publish cancel requests
        executor = await platform.bus("executor")  # (may read the consumers of the events' stream)
        try:
            forged = make_event(JobCancelRequested(job_id=job_id, by="mallory"), source="/forger")
            published = await bus.publish(forged, tenant=client.job(job_id).tenant)
            # every executor process has handled it: had it acted, it would have stopped the job by now
            await acknowledged(executor, EXECUTOR_CONTROL_DURABLES, published.seq)
        finally:
            await bus.close()
            await executor.close()

    asyncio.run(forge())
    job = client.job(job_id)
    assert job.state == "running" and not job.cancel_requested, job
    assert Path(f"/proc/{pid}").exists()  # the job's process was not stopped
    client.cancel(job_id)
    platform.wait_state(job_id, {"cancelled"})


def test_a_service_with_no_credentials_cannot_join(platform, tmp_path):
    env = {**platform.joining_env("executor"), "GPUYARD_NODE_NAME": "intruder"}
    env.pop("GPUYARD_NATS_CREDENTIALS")
    result = subprocess.run(
        [str(BIN / "python"), "-m", "gpuyard.services.executor"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "refused no user (anonymous)" in result.stderr


def test_a_tenants_integrator_reads_that_tenants_job_events_only_and_publishes_none(platform):
    """`gpuyard admin bus-user --tenant vision` on a running platform: the credentials file, the user in the
    configuration, and the running nats-server reloaded (SIGHUP). That user receives vision's job events and
    none of nlp's, may not subscribe to every job event or to nlp's, and may not publish."""
    made = platform.cli(
        "admin", "bus-user", "--tenant", "vision", "--data-dir", str(platform.data_dir), "--json"
    )
    assert made.returncode == 0, made.stderr
    answer = json.loads(made.stdout)
    path = platform.credentials("integrator-vision")
    assert answer["credentials"] == str(path) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert answer["reloaded_pid"] is not None, "the running nats-server was not found"
    client = platform.client()
    seen: list[tuple[str, str]] = []  # (NATS subject, job id)

    async def read() -> tuple[list[str], dict[str, str]]:
        creds = read_credentials(path)
        for _ in range(50):  # the server reloads its configuration a moment after the signal
            try:
                integrator = await Bus.connect([platform.nats_url], name="t", source="/t", credentials=creds)
                break
            except BusRefused:
                await asyncio.sleep(0.1)
        else:
            raise AssertionError("the tenant's integrator was never let in")
        errors = Errors()
        integrator.nc._error_cb = errors

        async def on_msg(msg) -> None:
            seen.append((msg.subject, CloudEvent.from_json(msg.data).subject))

        try:
            await integrator.subscribe(Wildcard.JOB.value, on_msg)  # every tenant's: refused
            await integrator.subscribe(subject_filter(Subject.JOB_SUCCEEDED, "nlp"), on_msg)  # nlp's: refused
            await integrator.subscribe(tenant_wildcard("vision"), on_msg)
            await integrator.nc.flush()
            await eventually(lambda: len(errors.violations()) >= 2, what="two subscription violations")
            jobs = {
                tenant: client.submit({"command": "true", "resources": {"gpus": 1}, "tenant": tenant}).job_id
                for tenant in ("nlp", "vision")
            }
            for job_id in jobs.values():
                await asyncio.to_thread(platform.wait_state, job_id, {"succeeded"})
            end = (subject_filter(Subject.JOB_SUCCEEDED, "vision"), jobs["vision"])
            await eventually(lambda: end in seen, what="vision's job.succeeded")
            await integrator.nc.publish(subject_filter(Subject.JOB_CANCEL_REQUESTED, "vision"), b"{}")
            await integrator.nc.flush()
            await eventually(lambda: len(errors.violations()) >= 3, what="the publish violation")
            return errors.violations(), jobs
        finally:
            await integrator.close()

    violations, jobs = asyncio.run(read())
    assert {job for _, job in seen} == {jobs["vision"]}  # none of nlp's job's events
    subjects = {subject for subject, _ in seen}
    assert subjects <= {subject_filter(s, "vision") for s in JOB_SUBJECTS} and "job.placed.vision" in subjects
    assert all(subject.endswith(".vision") for subject, _ in seen)
    text = " ".join(violations).lower()
    assert 'subscription to "job.>"' in text and "job.succeeded.nlp" in text and "publish" in text


async def test_the_supervisor_says_service_states_again_and_again_and_can_publish_nothing_else(secured):
    """`gpuyard up`'s reporter, as the `supervisor` user: a change goes out at once and is said again every
    interval; the user may publish no other event (and declares no stream: the services do)."""
    from gpuyard.shared.contracts.events.services import ProcessState, ServiceStatus
    from gpuyard.shared.contracts.events.subjects import TELEMETRY_STREAM
    from gpuyard.supervisor.statusreport import StatusReporter

    url, data_dir = secured
    integrator, _ = await connect(url, data_dir, Role.INTEGRATOR)
    scheduler, _ = await connect(url, data_dir, Role.SCHEDULER)
    supervisor, errors = await connect(url, data_dir, Role.SUPERVISOR)
    heard: list[CloudEvent] = []

    async def on_msg(msg) -> None:
        heard.append(CloudEvent.from_json(msg.data))

    reporter = StatusReporter([url], credentials_path(data_dir, Role.SUPERVISOR), interval=0.3)
    reporting = asyncio.create_task(reporter.run())
    try:
        await scheduler.ensure_streams()
        await integrator.subscribe(Subject.SERVICE_STATUS.value, on_msg)
        await integrator.nc.flush()
        looping = ServiceStatus(
            service="serving",
            process="serving",
            host="h",
            pid=41,
            state=ProcessState.CRASH_LOOPING,
            restarts=3,
            exit_code=1,
            last_error="RuntimeError: boom",
            version="1.0",
        )
        reporter.update(looping)
        await eventually(lambda: len(heard) >= 3, what="the status, said again")
        assert {e.data for e in heard} == {looping} and len({e.id for e in heard}) == len(heard)
        stored = (await scheduler.js.stream_info(TELEMETRY_STREAM.name)).state.messages
        assert stored >= 3
        with pytest.raises(Exception):  # noqa: B017 (no ack comes: nats-py times out)
            await asyncio.wait_for(supervisor.publish(placement("forged"), tenant=TENANT), 3)
        await eventually(errors.violations, what="the permissions violation")
        assert await stored_count(scheduler) == 0
    finally:
        await reporter.close(reporting)
        for bus in (integrator, scheduler, supervisor):
            await bus.close()
