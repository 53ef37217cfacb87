"""A placement says who holds its replicas (`JobPlaced.serving`, sent as the `Gpuyard-Holder` header), so that a
node's executor passes over serve jobs' placements and its serving service over every other job's, undecoded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.bus.headers import HOLDER_HEADER, placed_for
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.events.subjects import HOLDER_EXECUTOR, HOLDER_SERVING, Subject, subject_filter
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import apply
from gpuyard.shared.scheduling.model import GpuAssignment, Placement, ReplicaAssignment
from gpuyard.shared.settings.scheduler import SchedulerSettings

SPECS = {
    HOLDER_EXECUTOR: {"command": "python train.py", "resources": {"gpus": 0.25}},
    HOLDER_SERVING: {"serve": {"model": "mnist", "version": 1}, "resources": {"gpus": 0.25}},
}


def placement_of(spec: dict):
    """The event the scheduler makes when it places a job submitted with `spec`."""
    service = SimpleNamespace(ledger=None, bus=SimpleNamespace(js=None, replicas=1))
    held = SchedulerService(service, SchedulerSettings())
    submitted = JobSubmitted(job_id="j1", name="j1", tenant="t", user="u", spec=JobSpec.model_validate(spec))
    view = apply(None, make_event(submitted, source="/test"))
    held.view.put_job(view)
    replica = ReplicaAssignment(replica=0, node="n1", gpus=(GpuAssignment(index=0, fraction=0.25),))
    decision = held.decisions.placed(Placement("j1", (replica,)))
    return make_event(decision.decide(view), source="/test")


def msg_of(headers: dict[str, str] | None):
    return SimpleNamespace(subject=subject_filter(Subject.JOB_PLACED, "t"), headers=headers)


@pytest.mark.parametrize("holder", [HOLDER_EXECUTOR, HOLDER_SERVING])
def test_the_placement_names_its_holder_in_the_event_and_its_header(holder) -> None:
    event = placement_of(SPECS[holder])
    assert event.data.holder == holder
    headers = Bus._headers(event, version=2)
    assert headers[HOLDER_HEADER] == holder
    assert placed_for(holder)(msg_of(headers))
    other = HOLDER_SERVING if holder == HOLDER_EXECUTOR else HOLDER_EXECUTOR
    assert not placed_for(other)(msg_of(headers))  # passed over undecoded


def test_a_placement_without_the_header_is_decoded_by_both() -> None:
    event = placement_of(SPECS[HOLDER_EXECUTOR])
    for holder in (HOLDER_EXECUTOR, HOLDER_SERVING):
        assert placed_for(holder)(msg_of(None))
        assert placed_for(holder)(msg_of({"Nats-Msg-Id": event.id}))


def test_only_placements_carry_the_header() -> None:
    submitted = JobSubmitted(job_id="j1", name="j1", tenant="t", user="u", spec=JobSpec(command="true"))
    assert HOLDER_HEADER not in Bus._headers(make_event(submitted, source="/test"), None)
