"""Job events travel on subjects that end with their job's tenant (`job.placed.vision`), so that one tenant's
integrator can be given that tenant's events and nothing else: the subject function, the tenant name rule, the
permission rows, the generated server configuration and `gpuyard admin bus-user`."""

from __future__ import annotations

import fcntl
import json
import os
import stat

import pytest

from gpuyard import cli
from gpuyard.shared.bus.credentials import credentials_path, read_credentials
from gpuyard.shared.bus.permissions import (
    GRANTS,
    Role,
    permissions,
    tenant_integrator,
    tenant_of_integrator,
    tenant_permissions,
)
from gpuyard.shared.contracts.events.alerts import AlertRaised
from gpuyard.shared.contracts.events.envelope import make_event, subject_of, utcnow
from gpuyard.shared.contracts.events.jobs import JobPlaced, JobSubmitted, ReplicaPlacement
from gpuyard.shared.contracts.events.nodes import NodeLost
from gpuyard.shared.contracts.events.subjects import (
    JOB_SUBJECTS,
    Subject,
    subject_filter,
    tenant_error,
    tenant_of_subject,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.supervisor import busconfig

PLACED = JobPlaced(job_id="j1", attempt=1, placements=[ReplicaPlacement(replica=0, node="n")])


def test_a_job_event_is_published_with_its_tenant_as_the_last_token():
    placed = make_event(PLACED, source="/s")
    assert subject_of(placed, "vision") == "job.placed.vision"
    assert placed.type == "io.gpuyard.job.placed" and placed.nats_subject is Subject.JOB_PLACED  # unchanged
    submitted = JobSubmitted(job_id="j1", name="n", tenant="nlp", user="u", spec=JobSpec(command="true"))
    assert subject_of(make_event(submitted, source="/s")) == "job.submitted.nlp"  # it names its tenant
    assert tenant_of_subject("job.placed.vision") == "vision"


def test_a_job_event_without_its_tenant_or_with_a_bad_one_has_no_subject():
    placed = make_event(PLACED, source="/s")
    with pytest.raises(ValueError, match="tenant is needed"):
        subject_of(placed)
    for bad in ("a.b", "*", ">", "has space", "", "Vision", "x" * 64):
        with pytest.raises(ValueError, match="not a valid tenant name"):
            subject_of(placed, bad)


def test_other_families_keep_their_subjects():
    lost = make_event(NodeLost(node="n1", last_seen=utcnow()), source="/s")
    alert = make_event(AlertRaised(alert_id="a", kind="gpu_idle", message="m"), source="/s")
    assert subject_of(lost) == "node.lost" and subject_of(alert) == "alert.raised"
    assert subject_of(lost, "vision") == "node.lost"  # a tenant given for it changes nothing
    assert tenant_of_subject("node.lost") is None and tenant_of_subject("gpu.sample") is None
    assert subject_filter(Subject.NODE_HEARTBEAT) == "node.heartbeat"
    with pytest.raises(ValueError):
        subject_filter(Subject.NODE_HEARTBEAT, "vision")


def test_filters_of_a_job_subject_match_every_tenant_or_one():
    assert {subject_filter(s) for s in JOB_SUBJECTS} == {f"{s.value}.*" for s in JOB_SUBJECTS}
    assert subject_filter(Subject.JOB_PLACED, "vision") == "job.placed.vision"
    assert {s for s in Subject if s.value.split(".")[0] == "job"} == JOB_SUBJECTS


@pytest.mark.parametrize("tenant", ["vision", "nlp", "team-a", "t", "a", "ops", "research", "x" * 63])
def test_tenant_names_in_use_are_valid(tenant):
    assert tenant_error(tenant) is None


@pytest.mark.parametrize(
    "tenant", ["a.b", "a*", "a>", "a b", "a\tb", "", "-a", "a-", "Bad_Tenant", "ü", None]
)
def test_a_tenant_that_cannot_be_one_subject_token_is_refused_with_the_rule(tenant):
    assert "lowercase letters, digits and '-'" in tenant_error(tenant)


# ------------------------------------------------------------------------------------------ permissions


def test_publishers_may_publish_their_job_events_for_every_tenant_only():
    scheduler = permissions(Role.SCHEDULER).publish
    assert "job.placed.*" in scheduler and "node.lost" in scheduler
    assert not any(p in scheduler for p in ("job.placed", "job.>", "job.placed.>", "job.started.*"))
    for role in Role:
        job_rules = [p for p in permissions(role).publish if p.startswith("job.")]
        assert job_rules == sorted(subject_filter(s) for s in GRANTS[role].publishes if s in JOB_SUBJECTS), (
            role
        )


def test_a_tenants_integrator_reads_that_tenants_job_events_and_publishes_nothing():
    allowed = tenant_permissions("vision")
    assert allowed.subscribe == ("job.*.vision",) and allowed.publish == ()
    assert tenant_integrator("vision") == "integrator-vision"
    assert tenant_of_integrator("integrator-vision") == "vision"
    assert tenant_of_integrator("integrator") is None and tenant_of_integrator("submit") is None
    assert tenant_of_integrator("integrator-a.b") is None
    with pytest.raises(ValueError, match="not a valid tenant name"):
        tenant_integrator("a.>")


def test_the_server_config_gives_each_tenants_integrator_its_own_rule(tmp_path):
    (tmp_path / "bus").mkdir(mode=0o700)
    busconfig.add_tenant_integrator(tmp_path, "vision")
    busconfig.add_tenant_integrator(tmp_path, "nlp")
    text = (tmp_path / "bus" / "nats.conf").read_text()
    assert text.count("user: ") == len(Role) + 2
    vision = text.split('user: "integrator-vision"')[1].split("}}")[0]
    assert 'publish: {deny: [">"]}' in vision and 'subscribe: {allow: ["job.*.vision"]}' in vision
    nlp = text.split('user: "integrator-nlp"')[1].split("}}")[0]
    assert 'subscribe: {allow: ["job.*.nlp"]}' in nlp
    assert busconfig.tenant_integrators(tmp_path) == ("nlp", "vision")
    again = busconfig.write_config(tmp_path)  # what `gpuyard up` does at every start: they stay
    assert 'user: "integrator-vision"' in again.read_text()


def test_bus_user_makes_a_private_credentials_file_and_says_where(tmp_path, capsys):
    assert cli.main(["admin", "bus-user", "--tenant", "vision", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    path = credentials_path(tmp_path, "integrator-vision")
    assert str(path) in out and "job.*.vision" in out and "next `gpuyard up`" in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    creds = read_credentials(path)
    assert creds.user == "integrator-vision"
    assert creds.password in (tmp_path / "bus" / "nats.conf").read_text()
    # again: the same credentials (an integration already configured keeps working)
    assert cli.main(["admin", "bus-user", "--tenant", "vision", "--data-dir", str(tmp_path), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["credentials"] == str(path) and answer["reloaded_pid"] is None
    assert read_credentials(path) == creds


def test_bus_user_refuses_a_tenant_that_is_not_a_subject_token(tmp_path, capsys):
    assert cli.main(["admin", "bus-user", "--tenant", "a.b", "--data-dir", str(tmp_path)]) == 1
    assert "not a valid tenant name" in capsys.readouterr().err
    assert not (tmp_path / "bus").exists()


def test_no_process_is_signalled_without_a_running_gpuyard_up(tmp_path):
    """A pid file left behind by a stopped platform may name any process now: without `up.lock` held, and
    without that process being this data dir's nats-server, nothing is signalled."""
    (tmp_path / "bus").mkdir(mode=0o700)
    (tmp_path / "bus" / busconfig.PID_FILE).write_text(str(os.getpid()))
    assert busconfig.running_nats(tmp_path) is None
    (tmp_path / busconfig.LOCK_FILE).touch()
    assert busconfig.running_nats(tmp_path) is None  # not held
    with open(tmp_path / busconfig.LOCK_FILE, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as `gpuyard up` holds it
        assert busconfig.up_running(tmp_path)
        assert busconfig.running_nats(tmp_path) is None  # the pid is this test's python, not nats-server
