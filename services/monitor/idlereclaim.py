"""Idle-GPU reclaim, the monitor's side: from every node's `gpu.sample` and the live jobs to what to record,
publish and alert. No I/O here: the alert service (`gpuyard.services.monitor.alertservice`), which holds the
`monitor-alerts` lease, feeds it (so one monitor decides) and carries out what it returns.

Per running attempt whose job has an idle timeout (its spec's, else its tenant's default), an `IdleWatch` takes
the highest utilization of the GPUs it holds in each node's sample, and `judge` decides (`gpuyard.services.monitor.
idle`):

- warn: an `idle.warning` (recorded, then published: the executor writes a line into the job's output) and a
  `job_idle` alert (`job_idle/<job id>/<attempt>`);
- withdraw: its GPUs got busy during the grace (or, for a dev environment, its user was active: `dev.activity`,
  `activity`): the alert is resolved, nothing is stopped;
- stop: an `idle.stop` (the executor stops the attempt, which ends `failed`, reason `idle`) and the alert
  resolved.

Every event id is derived from the fact (job, attempt, and when its idleness began), so a decision made twice (a
new leader that restored the active alerts) records nothing twice. A job that ends, or whose attempt changes,
is forgotten, and its warning withdrawn.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuyard.services.monitor.alerts import ActiveAlert, Raise, Resolve
from gpuyard.services.monitor.idle import (
    GAP_SAMPLES,
    Finding,
    IdlePolicy,
    IdleWatch,
    Verdict,
    judge,
    policy_for,
    stop_text,
    warning_text,
)
from gpuyard.services.monitor.jobs import LiveJob, LiveJobs
from gpuyard.shared.contracts.events.alerts import (
    AlertKind,
    AlertRaised,
    AlertResolved,
    AlertSeverity,
    IdleStop,
    IdleWarning,
)
from gpuyard.shared.contracts.events.dev import DevActivity
from gpuyard.shared.contracts.events.envelope import derived_id
from gpuyard.shared.contracts.events.nodes import GpuSample
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.settings.monitor import MonitorSettings

KIND = AlertKind.JOB_IDLE


@dataclass(frozen=True, slots=True)
class Record:
    """An idle event to record in the job's idle stream (`gpuyard.shared.stores.readmodels.idlebook`), then publish."""

    data: IdleWarning | IdleStop
    event_id: str
    at: datetime


Action = Record | Raise | Resolve


def alert_id(job_id: str, attempt: int) -> str:
    return f"{KIND}/{job_id}/{attempt}"


@dataclass(slots=True)
class _Warned:
    """An active `job_idle` alert: which attempt, its raise's event id, and (restored from the store) when it
    was raised."""

    attempt: int
    raised_id: str
    tenant: str | None
    warned_at: datetime | None = None


class IdleReclaim:
    def __init__(
        self,
        live: LiveJobs,
        *,
        tenant_timeouts: dict[str, float],
        default_grace: float,
        threshold_pct: float,
        min_age: float,
    ):
        self.live = live
        self.tenant_timeouts = tenant_timeouts
        self.default_grace = default_grace
        self.threshold_pct = threshold_pct
        self.min_age = min_age
        self.watches: dict[str, IdleWatch] = {}
        self.warned: dict[str, _Warned] = {}

    @classmethod
    def of(cls, live: LiveJobs, settings: MonitorSettings) -> IdleReclaim:
        return cls(
            live,
            tenant_timeouts=settings.idle_timeouts,
            default_grace=settings.idle_grace,
            threshold_pct=settings.idle_threshold_pct,
            min_age=settings.idle_min_age,
        )

    def policy(self, job: LiveJob) -> IdlePolicy | None:
        if job.serves:
            return None  # a model server idle between requests is not wasting its GPU
        return policy_for(
            job.idle_timeout,
            job.idle_grace,
            job.tenant,
            tenant_timeouts=self.tenant_timeouts,
            default_grace=self.default_grace,
            threshold_pct=self.threshold_pct,
            min_age=self.min_age,
        )

    # ------------------------------------------------------------------ what it is fed

    def restore(self, active: Iterable[ActiveAlert]) -> None:
        """A new leader: the `job_idle` alerts still active (from the store). Their jobs stay warned, idle since
        then: stopped when their grace is over, unless a sample says they are busy."""
        self.watches.clear()
        self.warned.clear()
        for alert in active:
            raised = alert.raised
            if raised.kind != KIND or raised.job_id is None:
                continue
            attempt = raised.alert_id.rsplit("/", 1)[-1]
            if not attempt.isdigit():
                continue
            self.warned[raised.job_id] = _Warned(int(attempt), alert.raised_id, raised.tenant, alert.since)

    def sample(self, sample: GpuSample, at: datetime) -> list[Action]:
        """One node's GPUs at `at`: each running job's highest utilization on them, then its verdict."""
        highest: dict[str, float] = {}
        unknown: set[str] = set()  # jobs holding a GPU that says nothing: this sample never makes them idle
        for gpu in sample.gpus:
            for holder in gpu.holders:
                if gpu.utilization_pct is None:
                    unknown.add(holder.job_id)
                else:
                    highest[holder.job_id] = max(highest.get(holder.job_id, 0.0), gpu.utilization_pct)
        for job_id in unknown:
            highest.pop(job_id, None)
        max_gap = GAP_SAMPLES * sample.interval_seconds
        actions: list[Action] = []
        for job_id, utilization in highest.items():
            job = self.live.jobs.get(job_id)
            if job is None or job.state != JobState.RUNNING:
                continue
            policy = self.policy(job)
            if policy is None:
                continue
            watch = self._watch(job, policy, actions, at)
            watch.observe(at, utilization, policy, max_gap=max_gap)
            actions += self._decide(job, watch, policy, judge(watch, policy), at)
        return actions

    def activity(self, activity: DevActivity) -> list[Action]:
        """A user's activity in a dev environment (`dev.activity`): its attempt counts as busy at `activity.at`,
        as a busy sample would (its idle window starts over there), and a warning it has is withdrawn. Never a
        warning or a stop: those come from the samples. One for another attempt, a job that does not run or is
        not a dev environment, and one older than what is known (or repeated) change nothing."""
        job = self.live.jobs.get(activity.job_id)
        if job is None or not job.dev or job.state != JobState.RUNNING or job.attempt != activity.attempt:
            return []
        policy = self.policy(job)
        if policy is None:
            return []
        actions: list[Action] = []
        watch = self._watch(job, policy, actions, activity.at)
        watch.active(activity.at)
        if judge(watch, policy).verdict is Verdict.WITHDRAW:
            watch.warned_at = None
            actions += self._withdraw(job.job_id, activity.at, "its user is active again: it is not stopped")
        return actions

    def jobs(self, at: datetime) -> list[Action]:
        """The live jobs changed (or time passed): the attempts no longer running are forgotten, and a warning
        still active for one of them is withdrawn."""
        if not self.live.refreshed:
            return []
        actions: list[Action] = []
        for job_id in set(self.watches) | set(self.warned):
            job = self.live.jobs.get(job_id)
            watch = self.watches.get(job_id)
            attempt = watch.attempt if watch else self.warned[job_id].attempt
            if job is not None and job.state == JobState.RUNNING and job.attempt == attempt:
                continue
            self.watches.pop(job_id, None)
            actions += self._withdraw(job_id, at, "the job no longer runs")
        return actions

    def unrecorded(self, record: Record) -> None:
        """`record` could not be stored: a stop is decided again at the job's next sample (a warning is not:
        its alert stands, and the stop follows after the grace)."""
        watch = self.watches.get(record.data.job_id)
        if isinstance(record.data, IdleStop) and watch is not None and watch.attempt == record.data.attempt:
            watch.stopped = False

    # ------------------------------------------------------------------ deciding

    def _watch(self, job: LiveJob, policy: IdlePolicy, actions: list[Action], at: datetime) -> IdleWatch:
        watch = self.watches.get(job.job_id)
        if watch is not None and watch.attempt == job.attempt:
            return watch
        warned = self.warned.get(job.job_id)
        if warned is not None and warned.attempt != job.attempt:
            actions += self._withdraw(job.job_id, at, "the job no longer runs")
            warned = None
        watch = self.watches[job.job_id] = IdleWatch(job.job_id, job.attempt, started_at=job.since)
        if warned is not None and warned.warned_at is not None:  # restored: warned then, after a whole window
            watch.first_at = warned.warned_at - timedelta(seconds=policy.timeout)
            watch.warned_at = warned.warned_at
        return watch

    def _decide(
        self, job: LiveJob, watch: IdleWatch, policy: IdlePolicy, found: Finding, at: datetime
    ) -> list[Action]:
        if found.verdict is Verdict.WARN:
            return self._warn(job, watch, policy, found, at)
        if found.verdict is Verdict.WITHDRAW:
            watch.warned_at = None
            return self._withdraw(job.job_id, at, "its GPUs are busy again: it is not stopped")
        if found.verdict is Verdict.STOP:
            watch.stopped = True
            message = stop_text(policy, found)
            stop = IdleStop(
                **self._figures(job, policy, found, message), idle_seconds=round(found.idle_seconds, 3)
            )
            record = Record(stop, derived_id(job.job_id, job.attempt, "idle_stop"), at)
            return [record, *self._withdraw(job.job_id, at, "the job was stopped for idle GPUs")]
        return []

    def _warn(
        self, job: LiveJob, watch: IdleWatch, policy: IdlePolicy, found: Finding, at: datetime
    ) -> list[Action]:
        assert watch.last_at is not None and found.idle_since is not None
        watch.warned_at = watch.last_at
        message = warning_text(policy, found)
        since = found.idle_since.isoformat()
        warning = IdleWarning(
            **self._figures(job, policy, found, message),
            grace_seconds=policy.grace,
            stop_at=watch.last_at + timedelta(seconds=policy.grace),
        )
        aid = alert_id(job.job_id, job.attempt)
        raised = AlertRaised(
            alert_id=aid,
            kind=KIND,
            severity=AlertSeverity.WARNING,
            message=f"job {job.job_id} ({job.name}): {message}",
            job_id=job.job_id,
            tenant=job.tenant,
            user=job.user or None,
            value=round(found.max_utilization_pct, 2),
            threshold=policy.threshold_pct,
        )
        raise_id = derived_id(aid, "raised", since)
        self.warned[job.job_id] = _Warned(job.attempt, raise_id, job.tenant)
        return [
            Record(warning, derived_id(job.job_id, job.attempt, "idle_warning", since), at),
            Raise(raised, raise_id, at, found.idle_since),
        ]

    def _withdraw(self, job_id: str, at: datetime, why: str) -> list[Action]:
        warned = self.warned.pop(job_id, None)
        if warned is None:
            return []
        aid = alert_id(job_id, warned.attempt)
        resolved = AlertResolved(alert_id=aid, kind=KIND, message=why, tenant=warned.tenant)
        return [Resolve(resolved, derived_id(aid, "resolved", warned.raised_id), at, warned.raised_id)]

    @staticmethod
    def _figures(job: LiveJob, policy: IdlePolicy, found: Finding, message: str) -> dict:
        return {
            "job_id": job.job_id,
            "attempt": job.attempt,
            "tenant": job.tenant,
            "user": job.user,
            "threshold_pct": policy.threshold_pct,
            "window_seconds": policy.timeout,
            "max_utilization_pct": round(found.max_utilization_pct, 2),
            "message": message,
        }
