"""When the scheduler stores why a job waits: a job that only waits its turn gets a reason once it has waited
`pending_after` seconds; a reason that says the job cannot run soon, or that it makes room by preemption,
is stored at once."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import apply
from gpuyard.shared.contracts.reasons import WAITING_ITS_TURN, PendingCode
from gpuyard.shared.scheduling.reasons import Reason
from gpuyard.shared.settings.scheduler import SchedulerSettings

SUBMITTED_AT = 1_800_000_000.0


def scheduler(pending_after: float) -> SchedulerService:
    service = SimpleNamespace(ledger=None, bus=SimpleNamespace(js=None, replicas=1))
    held = SchedulerService(service, SchedulerSettings(pending_after=pending_after))
    job = JobSubmitted(job_id="j1", name="j1", tenant="t", user="u", spec=JobSpec(command="true"))
    event = make_event(job, source="/test", time=datetime.fromtimestamp(SUBMITTED_AT, UTC))
    held.view.put_job(apply(None, event))
    return held


def stores(held: SchedulerService, code: str, waited: float) -> bool:
    reason = Reason(code, "why", {}, position=1, now=SUBMITTED_AT + waited)
    return held.decisions.waiting("j1", reason, SUBMITTED_AT + waited) is not None


@pytest.mark.parametrize("code", sorted(WAITING_ITS_TURN))
def test_a_job_waiting_its_turn_gets_its_reason_once_it_has_waited_pending_after(code) -> None:
    held = scheduler(pending_after=1.0)
    assert not stores(held, code, waited=0.3)
    assert stores(held, code, waited=1.2)


@pytest.mark.parametrize("code", sorted(set(PendingCode) - WAITING_ITS_TURN))
def test_a_job_that_cannot_run_soon_or_preempts_gets_its_reason_at_once(code) -> None:
    assert stores(scheduler(pending_after=1.0), code, waited=0.0)


def test_pending_after_zero_stores_every_reason_at_once() -> None:
    assert stores(scheduler(pending_after=0.0), PendingCode.INSUFFICIENT_GPUS, waited=0.0)
