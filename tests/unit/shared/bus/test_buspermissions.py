"""The bus users' permission table (shared/bus/permissions.py): each event has the publishers it should, the
generated nats-server configuration says exactly that, and a service's outbox relay keeps to its own events."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuyard.shared.bus.credentials import BusCredentials
from gpuyard.shared.bus.permissions import (
    GRANTS,
    NOT_PUBLISHED_YET,
    SERVICE_ROLES,
    Role,
    permissions,
    publishers,
    publishes,
)
from gpuyard.shared.contracts.events.envelope import subject_of, type_of
from gpuyard.shared.contracts.events.jobs import JobPlaced, JobSubmitted, ReplicaPlacement
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.supervisor.busconfig import render

ONLY = {
    Subject.JOB_SUBMITTED: [Role.SUBMIT],
    Subject.JOB_CANCEL_REQUESTED: [Role.SUBMIT],
    Subject.JOB_PLACED: [Role.SCHEDULER],
    Subject.JOB_PENDING: [Role.SCHEDULER],
    Subject.JOB_PREEMPTED: [Role.SCHEDULER],
    Subject.NODE_LOST: [Role.SCHEDULER],
    # the hosts of replicas: the executor runs commands, the serving service holds serve jobs' sessions
    Subject.JOB_STARTED: [Role.EXECUTOR, Role.SERVING],
    Subject.JOB_REPLICA_EXITED: [Role.EXECUTOR, Role.SERVING],
    Subject.JOB_SUCCEEDED: [Role.EXECUTOR, Role.SERVING],
    Subject.JOB_FAILED: [Role.EXECUTOR, Role.SERVING],
    Subject.NODE_HEARTBEAT: [Role.EXECUTOR],
    Subject.GPU_SAMPLE: [Role.MONITOR],
    Subject.JOB_CANCELLED: [Role.SUBMIT, Role.EXECUTOR, Role.SERVING],  # a queued job's; a placed one's
    Subject.JOB_REQUEUED: [Role.SCHEDULER, Role.EXECUTOR, Role.SERVING],  # a lost node's; retries, lost ones
    Subject.MODEL_PUBLISHED: [Role.SUBMIT],
    Subject.MODEL_READY: [Role.SERVING],
    Subject.MODEL_FAILED: [Role.SERVING],
}


@pytest.mark.parametrize("subject", list(ONLY), ids=str)
def test_each_state_change_has_exactly_its_publishers(subject):
    assert publishers(subject) == ONLY[subject]


def test_every_subject_has_a_publisher_but_those_not_published_yet():
    assert {s for s in Subject if not publishers(s)} == NOT_PUBLISHED_YET
    assert all(Subject.SERVICE_HEARTBEAT in GRANTS[r].publishes for r in SERVICE_ROLES)


def test_the_integrator_publishes_nothing_and_the_server_is_told_so():
    assert permissions(Role.INTEGRATOR).publish == ()
    creds = {r.value: BusCredentials(r.value, f"pw-{r.value}") for r in Role}
    text = render(creds)
    integrator = text.split('user: "integrator"')[1]
    assert 'publish: {deny: [">"]}' in integrator.split("}}")[0]  # an empty allow-list would allow all
    assert text.count("user: ") == len(Role) and "no_auth_user" not in text


def test_the_serving_service_follows_the_events_and_records_its_replicas():
    granted = permissions(Role.SERVING)
    for subject in ("job.started.*", "job.failed.*", "job.cancelled.*", "model.ready", "model.failed"):
        assert subject in granted.publish
    assert "job.placed.*" not in granted.publish and "model.published" not in granted.publish
    stream = "GPUYARD_EVENTS"
    assert f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>" in granted.publish  # job.placed, control events
    assert f"$JS.ACK.{stream}.>" in granted.publish and "deadletter.>" in granted.publish
    assert not any("TELEMETRY" in s for s in granted.publish if s.startswith("$JS.API.CONSUMER"))


def test_replies_come_to_each_roles_own_inbox_only():
    for role in SERVICE_ROLES:
        inboxes = [s for s in permissions(role).subscribe if s.startswith("_INBOX")]
        assert inboxes == [f"_INBOX.{role.value}.>"]


def test_a_name_that_is_no_role_publishes_everything():
    assert publishes("scheduler") == GRANTS[Role.SCHEDULER].publishes
    assert publishes("crashing-test-service") is None


class Published:
    def __init__(self) -> None:
        self.types: list[str] = []
        self.subjects: list[str] = []

    async def publish(self, event, *, tenant=None) -> None:
        self.types.append(event.type)
        self.subjects.append(subject_of(event, tenant))


async def test_the_outbox_relay_publishes_only_its_own_services_events(tmp_path):
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    try:
        spec = JobSpec(command="true")
        writer = JobLedger(store, None, "/w")  # stored, never published
        await writer.append("j1", JobSubmitted(job_id="j1", name="j", tenant="t", user="u", spec=spec))
        placement = [ReplicaPlacement(replica=0, node="n")]
        await writer.append("j1", JobPlaced(job_id="j1", attempt=1, placements=placement))
        bus = Published()
        relay = JobLedger(
            store, SimpleNamespace(publish=bus.publish), "/submit", publishes=publishes("submit")
        )
        assert await relay.flush(grace=0) == 1
        assert bus.types == [type_of(Subject.JOB_SUBMITTED)] and bus.subjects == ["job.submitted.t"]
        assert [e.nats_subject for e in await store.unpublished(older_than=0)] == [Subject.JOB_PLACED]
        scheduler = Published()
        relay = JobLedger(
            store, SimpleNamespace(publish=scheduler.publish), "/s", publishes=publishes("scheduler")
        )
        assert await relay.flush(grace=0) == 1
        assert scheduler.subjects == ["job.placed.t"]  # its tenant read from the job's projection
    finally:
        await store.close()


def test_the_operations_doc_lists_what_each_user_publishes():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[4] / "docs" / "operations.md").read_text()
    rows = text.split("| user | publishes |\n|---|---|\n", 1)[1].split("\n\n", 1)[0].splitlines()
    listed = {}
    for row in rows:
        _, user, subjects, _ = row.split("|")
        named = {w.strip("`,") for w in subjects.split() if w.startswith("`") and "." in w}
        listed[Role(user.strip().strip("`"))] = {Subject(s) for s in named if s in Subject._value2member_map_}
    assert listed == {role: set(grant.publishes) for role, grant in GRANTS.items()}
