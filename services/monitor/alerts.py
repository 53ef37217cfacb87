"""The alert engine: a pure state machine from observations (GPU samples, node heartbeats and losses, the jobs
waiting and running) with their times to the alerts to raise and to resolve. No I/O: the service part
(`gpuyard.services.monitor.alertservice`) feeds it and records what it returns.

Each alert id (`gpu_temperature/node-1/3`: the rule and its subject) has a tracker that goes
inactive → pending (the condition holds, not yet for `for`) → firing (raised) → clearing (the condition is
clear, not yet for `keep_firing_for`) → resolved, and back to firing from clearing when the condition returns
(`gpuyard.services.monitor.rules` explains the thresholds). An observation says of a tracker's condition one of:

- BREACH: past the raise threshold;
- BAND: between the two thresholds: a pending alert starts over, a firing one stays raised;
- CLEAR: past the clear threshold;
- GONE: its subject went away (the job let the GPU go, ended, was placed): resolved at once.

Event ids are derived from the alert id and when its condition began (`gpuyard.shared.contracts.events.envelope.derived_id`), so the
same observations give the same events whoever computes them, and a redelivered observation (not newer than
the last one seen) changes nothing. A restarted engine is given the alerts still active (`restore`), so it never
raises one again; one whose subject is no longer reported for STALE_SECONDS is resolved.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum

from gpuyard.services.monitor.rules import GpuXidRule, Rule, Rules
from gpuyard.shared.contracts.events.alerts import AlertKind, AlertRaised, AlertResolved
from gpuyard.shared.contracts.events.envelope import derived_id
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading, GpuSample
from gpuyard.shared.contracts.units import format_duration

STALE_SECONDS = 120.0
"""An alert whose subject was not reported for this long (a node's samples stopped, the monitor lost track) is
resolved as no longer reported; a lost node's alert is not: it is resolved by the node's heartbeat."""


class Verdict(Enum):
    BREACH = "breach"
    BAND = "band"
    CLEAR = "clear"
    GONE = "gone"


@dataclass(frozen=True, slots=True)
class Raise:
    data: AlertRaised
    event_id: str
    at: datetime
    since: datetime
    """When its condition began."""


@dataclass(frozen=True, slots=True)
class Resolve:
    data: AlertResolved
    event_id: str
    at: datetime
    raised_id: str
    """The event id of the `alert.raised` it ends."""


Change = Raise | Resolve

Judged = tuple[Verdict, Callable[[], AlertRaised]]
"""What an observation says of a rule's condition, and how to make its alert."""
Observation = tuple[str, str, Rule, Judged]
"""(alert id, kind, rule, what a sample says of it)."""


@dataclass(frozen=True, slots=True)
class ActiveAlert:
    """An alert raised and not resolved, as the event store holds it: what a restarted engine is given."""

    raised: AlertRaised
    raised_id: str
    since: datetime


@dataclass(frozen=True, slots=True)
class JobSnapshot:
    """A waiting or running job, as the monitor reads it from the store (and its output from the log store)."""

    job_id: str
    tenant: str
    user: str
    name: str
    since: datetime
    """Queued: when its current attempt was queued. Running: when it started."""
    output_bytes: int | None = None
    """Running: the bytes its replicas wrote so far (None: not known)."""


@dataclass(slots=True)
class Tracker:
    alert_id: str
    kind: str
    state: str = "inactive"  # pending, firing, clearing
    since: datetime | None = None
    cleared_at: datetime | None = None
    seen: datetime | None = None
    raised: AlertRaised | None = None
    raised_id: str | None = None
    node: str | None = None
    """The node whose samples report it (GPU rules): a sample of that node that leaves it out ends it."""


@dataclass(slots=True)
class _JobSigns:
    output_bytes: int | None
    last_sign: datetime


@dataclass
class Engine:
    rules: Rules = field(default_factory=Rules)
    trackers: dict[str, Tracker] = field(default_factory=dict)
    _by_node: dict[str, set[str]] = field(default_factory=dict)
    _gpu_active: dict[str, datetime] = field(default_factory=dict)  # job id -> last GPU activity
    _jobs: dict[str, _JobSigns] = field(default_factory=dict)  # running job -> its signs of life
    _born: datetime | None = None

    # ------------------------------------------------------------------ what it is fed

    def restore(self, active: Iterable[ActiveAlert], at: datetime) -> None:
        """The alerts still active (from the store): they are not raised again, and are resolved when their
        condition clears (or their subject is not reported for STALE_SECONDS from `at`)."""
        for alert in active:
            if alert.raised.kind not in Rules.model_fields:
                continue  # another publisher's (the executor's memory guard): not this engine's to end
            t = Tracker(
                alert.raised.alert_id,
                alert.raised.kind,
                "firing",
                since=alert.since,
                seen=at,
                raised=alert.raised,
                raised_id=alert.raised_id,
                node=alert.raised.node if alert.raised.gpu_index is not None else None,
            )
            self.trackers[t.alert_id] = t
            if t.node is not None:
                self._by_node.setdefault(t.node, set()).add(t.alert_id)

    def sample(self, sample: GpuSample, at: datetime) -> list[Change]:
        """One node's GPUs at `at` (the sample's time)."""
        self._born = self._born or at
        changes: list[Change] = []
        seen: set[str] = set()
        for gpu in sample.gpus:
            holders = {h.job_id: h for h in gpu.holders}
            util = gpu.utilization_pct  # (None: not reported, a lost GPU's)
            for job_id in holders:
                if util is not None and util >= self.rules.job_silent.gpu_below_pct:
                    self._gpu_active[job_id] = at
            subject, where = f"{sample.node}/{gpu.index}", f"GPU {gpu.index} on {sample.node}"
            observed = self._gpu_observations(gpu, subject, where)
            observed += self._holder_observations(gpu, subject, where, holders)
            for alert_id, kind, rule, (verdict, make) in observed:
                if verdict is not Verdict.CLEAR or alert_id in self.trackers:
                    seen.add(alert_id)
                    changes += self._step(alert_id, kind, rule, at, verdict, make, node=sample.node)
        return changes + self._unreported(sample, seen, at)

    def _gpu_observations(self, gpu: GpuReading, subject: str, where: str) -> list[Observation]:
        """What one GPU's reading says of each enabled GPU rule (`subject`: its node and index)."""
        rules = self.rules
        found: list[tuple[str, Rule, Judged]] = []
        if rules.gpu_temperature.enabled and gpu.temperature_c is not None:
            found.append((AlertKind.GPU_TEMPERATURE, rules.gpu_temperature, self._temperature(gpu, where)))
        if rules.gpu_power.enabled and (power := self._power(gpu, where)) is not None:
            found.append((AlertKind.GPU_POWER, rules.gpu_power, power))
        if rules.gpu_ecc.enabled and gpu.ecc_uncorrected is not None:
            found.append((AlertKind.GPU_ECC, rules.gpu_ecc, self._ecc(gpu, where)))
        if rules.gpu_lost.enabled:
            found.append((AlertKind.GPU_LOST, rules.gpu_lost, self._lost(gpu, where)))
        if rules.gpu_xid.enabled:
            fatal = [x for x in gpu.xids if x not in rules.gpu_xid.application_xids]
            found.append((AlertKind.GPU_XID, rules.gpu_xid, self._xid(fatal, gpu, where)))
        return [(f"{kind}/{subject}", kind, rule, judged) for kind, rule, judged in found]

    def _holder_observations(
        self, gpu: GpuReading, subject: str, where: str, holders: dict[str, GpuHolder]
    ) -> list[Observation]:
        """What one GPU's reading says of each job holding it, for each enabled job rule of a GPU."""
        rules = self.rules
        application = [x for x in gpu.xids if x in rules.gpu_xid.application_xids]
        found: list[Observation] = []
        for job_id, holder in holders.items():
            if rules.gpu_idle.enabled and gpu.utilization_pct is not None:
                alert_id = f"{AlertKind.GPU_IDLE}/{subject}/{job_id}"
                idle = self._idle(gpu.utilization_pct, gpu, where, holder)
                found.append((alert_id, AlertKind.GPU_IDLE, rules.gpu_idle, idle))
            if rules.job_xid.enabled:
                alert_id = f"{AlertKind.JOB_XID}/{subject}/{job_id}"
                verdict = self._job_xid(application, gpu, where, holder)
                found.append((alert_id, AlertKind.JOB_XID, rules.job_xid, verdict))
        return found

    def _unreported(self, sample: GpuSample, seen: set[str], at: datetime) -> list[Change]:
        """The node's alerts its sample did not report: gone (the GPU, or the job on it), or clear."""
        changes: list[Change] = []
        for alert_id in self._by_node.get(sample.node, set()) - seen:
            tracker = self.trackers.get(alert_id)
            if tracker is None:
                continue
            if tracker.kind in (AlertKind.GPU_IDLE, AlertKind.JOB_XID) or not any(
                alert_id == f"{tracker.kind}/{sample.node}/{g.index}" for g in sample.gpus
            ):
                changes += self._step(alert_id, tracker.kind, self._rule(tracker.kind), at, Verdict.GONE)
            else:  # its GPU is there and reads clear (nothing to report: no tracker made for it)
                changes += self._step(alert_id, tracker.kind, self._rule(tracker.kind), at, Verdict.CLEAR)
        return changes

    def node_lost(self, node: str, at: datetime, last_seen: datetime | None = None) -> list[Change]:
        """The scheduler's `node.lost` for `node`."""
        rule = self.rules.node_lost
        if not rule.enabled:
            return []
        since = last_seen or at

        def make() -> AlertRaised:
            silent = format_duration(max(0.0, (at - since).total_seconds()))
            return AlertRaised(
                alert_id=f"{AlertKind.NODE_LOST}/{node}",
                kind=AlertKind.NODE_LOST,
                severity=rule.severity,
                message=f"node {node} lost: no heartbeat for {silent}; its jobs are requeued",
                node=node,
            )

        return self._step(
            f"{AlertKind.NODE_LOST}/{node}", AlertKind.NODE_LOST, rule, at, Verdict.BREACH, make
        )

    def node_heartbeat(self, node: str, at: datetime) -> list[Change]:
        """A `node.heartbeat` of `node`: a lost node is back (resolved after `keep_firing_for` of them)."""
        alert_id = f"{AlertKind.NODE_LOST}/{node}"
        if alert_id not in self.trackers:
            return []
        return self._step(alert_id, AlertKind.NODE_LOST, self.rules.node_lost, at, Verdict.CLEAR)

    def jobs(self, queued: list[JobSnapshot], running: list[JobSnapshot], at: datetime) -> list[Change]:
        """Every job waiting and every job running now (a job left out is neither any more)."""
        self._born = self._born or at
        changes: list[Change] = []
        changes += self._waiting(queued, at)
        changes += self._silent(running, at)
        return changes

    def tick(self, at: datetime) -> list[Change]:
        """Time passing without observations: alerts clear for `keep_firing_for` are resolved, and those whose
        subject was not reported for STALE_SECONDS."""
        changes: list[Change] = []
        for tracker in list(self.trackers.values()):
            rule = self._rule(tracker.kind)
            if tracker.state == "clearing" and tracker.cleared_at is not None:
                if (at - tracker.cleared_at).total_seconds() >= rule.keep_firing_for:
                    changes += self._end(tracker, at, self._cleared_message(tracker))
            elif (
                tracker.kind != AlertKind.NODE_LOST
                and tracker.seen is not None
                and (at - tracker.seen).total_seconds() >= STALE_SECONDS
            ):
                if tracker.state == "pending":
                    self._drop(tracker)
                else:
                    changes += self._end(tracker, at, "no longer reported")
        return changes

    def active(self) -> list[str]:
        """The alert ids raised and not resolved."""
        return sorted(a for a, t in self.trackers.items() if t.state in ("firing", "clearing"))

    # ------------------------------------------------------------------ the rules' conditions

    def _temperature(self, gpu: GpuReading, where: str):
        rule, temp = self.rules.gpu_temperature, gpu.temperature_c
        assert temp is not None
        verdict = (
            Verdict.BREACH
            if temp >= rule.above_c
            else Verdict.CLEAR
            if temp < rule.clear_below_c
            else Verdict.BAND
        )
        return verdict, lambda: AlertRaised(
            alert_id="", kind=AlertKind.GPU_TEMPERATURE, severity=rule.severity, node=None,
            message=f"{where} at {temp:.0f} °C, at or above {rule.above_c:g} °C for {_for(rule)}",
            gpu_index=gpu.index, value=temp, threshold=rule.above_c,
        )  # fmt: skip

    def _power(self, gpu: GpuReading, where: str):
        rule, power = self.rules.gpu_power, gpu.power_w
        if power is None:
            return None
        if rule.above_watts is not None:
            above, clear, limit_text = rule.above_watts, rule.clear_below_watts, f"{rule.above_watts:g} W"
        elif gpu.power_limit_w:
            above = rule.above_fraction * gpu.power_limit_w
            clear = rule.clear_below_fraction * gpu.power_limit_w
            limit_text = f"{rule.above_fraction:.0%} of its {gpu.power_limit_w:g} W limit"
        else:
            return None
        assert clear is not None
        verdict = Verdict.BREACH if power >= above else Verdict.CLEAR if power < clear else Verdict.BAND
        return verdict, lambda: AlertRaised(
            alert_id="", kind=AlertKind.GPU_POWER, severity=rule.severity,
            message=f"{where} draws {power:.0f} W, at or above {limit_text} for {_for(rule)}",
            gpu_index=gpu.index, value=power, threshold=above,
        )  # fmt: skip

    def _ecc(self, gpu: GpuReading, where: str):
        rule, count = self.rules.gpu_ecc, gpu.ecc_uncorrected or 0
        verdict = Verdict.BREACH if count > rule.above else Verdict.CLEAR
        return verdict, lambda: AlertRaised(
            alert_id="", kind=AlertKind.GPU_ECC, severity=rule.severity,
            message=f"{where} has {count} uncorrectable ECC error(s) since its driver loaded: reset it",
            gpu_index=gpu.index, value=float(count), threshold=float(rule.above),
        )  # fmt: skip

    def _lost(self, gpu: GpuReading, where: str):
        rule = self.rules.gpu_lost
        return Verdict.BREACH if gpu.lost else Verdict.CLEAR, lambda: AlertRaised(
            alert_id="", kind=AlertKind.GPU_LOST, severity=rule.severity,
            message=f"{where} is lost (fallen off the bus, NVML says): the node needs a reset",
            gpu_index=gpu.index,
        )  # fmt: skip

    def _xid(self, fatal: list[int], gpu: GpuReading, where: str):
        rule: GpuXidRule = self.rules.gpu_xid
        return Verdict.BREACH if fatal else Verdict.CLEAR, lambda: AlertRaised(
            alert_id="", kind=AlertKind.GPU_XID, severity=rule.severity,
            message=f"{where} reported fatal XID error(s) {', '.join(map(str, fatal))}: the GPU needs a reset",
            gpu_index=gpu.index, value=float(fatal[-1]),
        )  # fmt: skip

    def _idle(self, util: float, gpu: GpuReading, where: str, holder):
        rule = self.rules.gpu_idle
        verdict = (
            Verdict.BREACH
            if util < rule.below_pct
            else Verdict.CLEAR
            if util >= rule.clear_above_pct
            else Verdict.BAND
        )
        return verdict, lambda: AlertRaised(
            alert_id="", kind=AlertKind.GPU_IDLE, severity=rule.severity,
            message=f"job {holder.job_id} holds {where} but leaves it idle: under {rule.below_pct:g}% "
            f"utilization in every sample for {_for(rule)}",
            gpu_index=gpu.index, job_id=holder.job_id, tenant=holder.tenant, user=holder.user or None,
            value=util, threshold=rule.below_pct,
        )  # fmt: skip

    def _job_xid(self, application: list[int], gpu: GpuReading, where: str, holder):
        rule = self.rules.job_xid
        return Verdict.BREACH if application else Verdict.CLEAR, lambda: AlertRaised(
            alert_id="", kind=AlertKind.JOB_XID, severity=rule.severity,
            message=f"job {holder.job_id} hit XID error(s) {', '.join(map(str, application))} on {where}: "
            "an application error (the GPU is healthy); see the job's output",
            gpu_index=gpu.index, job_id=holder.job_id, tenant=holder.tenant, user=holder.user or None,
            value=float(application[-1]),
        )  # fmt: skip

    def _waiting(self, queued: list[JobSnapshot], at: datetime) -> list[Change]:
        rule = self.rules.job_waiting
        changes: list[Change] = []
        now = set()
        for job in queued if rule.enabled else []:
            alert_id = f"{AlertKind.JOB_WAITING}/{job.job_id}"
            now.add(alert_id)
            waited = (at - job.since).total_seconds()
            verdict = Verdict.BREACH if waited >= rule.for_ else Verdict.CLEAR
            if verdict is Verdict.CLEAR and alert_id not in self.trackers:
                continue

            def make(job=job, waited=waited) -> AlertRaised:
                return AlertRaised(
                    alert_id="", kind=AlertKind.JOB_WAITING, severity=rule.severity,
                    message=f"job {job.job_id} ({job.name}) has waited {format_duration(waited)} in the queue, "
                    f"over {format_duration(rule.for_)}: `gpuyard why {job.job_id}` says why",
                    job_id=job.job_id, tenant=job.tenant, user=job.user or None,
                    value=round(waited / 60, 1), threshold=round(rule.for_ / 60, 1),
                )  # fmt: skip

            changes += self._step(
                alert_id, AlertKind.JOB_WAITING, rule, at, verdict, make, since=job.since, hold=0
            )
        changes += self._gone(f"{AlertKind.JOB_WAITING}/", now, at)
        return changes

    def _silent(self, running: list[JobSnapshot], at: datetime) -> list[Change]:
        rule = self.rules.job_silent
        changes: list[Change] = []
        now = set()
        for job in running:
            signs = self._jobs.get(job.job_id)
            if signs is None:  # first seen: silent since it started, or since the engine began watching
                assert self._born is not None
                last = max(job.since, self._born)
                raised = self.trackers.get(f"{AlertKind.JOB_SILENT}/{job.job_id}")
                if raised is not None and raised.since is not None:  # silent already (restored): since then
                    last = min(last, raised.since - timedelta(seconds=rule.for_))
                signs = _JobSigns(job.output_bytes, last)
                self._jobs[job.job_id] = signs
            elif job.output_bytes is not None and job.output_bytes != signs.output_bytes:
                signs.output_bytes, signs.last_sign = job.output_bytes, at
            if (active := self._gpu_active.get(job.job_id)) is not None and active > signs.last_sign:
                signs.last_sign = active
            if not rule.enabled:
                continue
            alert_id = f"{AlertKind.JOB_SILENT}/{job.job_id}"
            now.add(alert_id)
            silent = (at - signs.last_sign).total_seconds()
            verdict = Verdict.BREACH if silent >= rule.for_ else Verdict.CLEAR
            if verdict is Verdict.CLEAR and alert_id not in self.trackers:
                continue

            def make(job=job, silent=silent) -> AlertRaised:
                return AlertRaised(
                    alert_id="", kind=AlertKind.JOB_SILENT, severity=rule.severity,
                    message=f"job {job.job_id} ({job.name}) runs but wrote no output and used its GPUs under "
                    f"{rule.gpu_below_pct:g}% for {format_duration(silent)}: is it stuck?",
                    job_id=job.job_id, tenant=job.tenant, user=job.user or None,
                    value=round(silent / 60, 1), threshold=round(rule.for_ / 60, 1),
                )  # fmt: skip

            since = signs.last_sign
            changes += self._step(
                alert_id, AlertKind.JOB_SILENT, rule, at, verdict, make, since=since, hold=0
            )
        running_ids = {job.job_id for job in running}
        for job_id in set(self._jobs) - running_ids:
            del self._jobs[job_id]
        for job_id in set(self._gpu_active) - running_ids:
            del self._gpu_active[job_id]
        changes += self._gone(f"{AlertKind.JOB_SILENT}/", now, at)
        return changes

    # ------------------------------------------------------------------ the state machine

    def _step(
        self,
        alert_id: str,
        kind: str,
        rule: Rule,
        at: datetime,
        verdict: Verdict,
        make: Callable[[], AlertRaised] | None = None,
        *,
        node: str | None = None,
        since: datetime | None = None,
        hold: float | None = None,
    ) -> list[Change]:
        """One observation of `alert_id`'s condition at `at`. `since`: when the condition began, when the
        observation knows it (a job's queued time); `hold`: the `for` to apply (the rule's by default)."""
        tracker = self.trackers.get(alert_id)
        if tracker is None:
            if verdict is not Verdict.BREACH:
                return []
            tracker = self.trackers[alert_id] = Tracker(alert_id, kind, node=node)
            if node is not None:
                self._by_node.setdefault(node, set()).add(alert_id)
        elif tracker.seen is not None and at < tracker.seen:
            return []  # older than what it saw: a redelivery
        tracker.seen = at
        hold = rule.for_ if hold is None else hold
        if verdict is Verdict.GONE:
            if tracker.state == "pending":
                self._drop(tracker)
                return []
            return self._end(tracker, at, self._gone_message(tracker))
        if tracker.state in ("inactive", "pending"):
            if verdict is not Verdict.BREACH:
                self._drop(tracker)
                return []
            if tracker.state == "inactive" or since is not None:
                tracker.state, tracker.since = "pending", since or tracker.since or at
            assert tracker.since is not None
            if (at - tracker.since).total_seconds() >= hold and make is not None:
                return [self._raise(tracker, make, at)]
            return []
        if verdict is Verdict.BREACH or verdict is Verdict.BAND:
            tracker.state, tracker.cleared_at = "firing", None
            return []
        if tracker.state == "firing":  # clear
            tracker.state, tracker.cleared_at = "clearing", at
        assert tracker.cleared_at is not None
        if (at - tracker.cleared_at).total_seconds() >= rule.keep_firing_for:
            return self._end(tracker, at, self._cleared_message(tracker))
        return []

    def _raise(self, tracker: Tracker, make: Callable[[], AlertRaised], at: datetime) -> Raise:
        assert tracker.since is not None
        made = make()
        node = made.node
        if node is None and tracker.node is not None:
            node = tracker.node
        data = made.model_copy(update={"alert_id": tracker.alert_id, "node": node})
        event_id = derived_id(tracker.alert_id, "raised", tracker.since.isoformat())
        tracker.state, tracker.raised, tracker.raised_id = "firing", data, event_id
        return Raise(data, event_id, at, tracker.since)

    def _end(self, tracker: Tracker, at: datetime, message: str) -> list[Change]:
        self._drop(tracker)
        assert tracker.raised_id is not None
        data = AlertResolved(
            alert_id=tracker.alert_id,
            kind=tracker.kind,
            message=message,
            tenant=tracker.raised.tenant if tracker.raised else None,
        )
        return [
            Resolve(data, derived_id(tracker.alert_id, "resolved", tracker.raised_id), at, tracker.raised_id)
        ]

    def _drop(self, tracker: Tracker) -> None:
        self.trackers.pop(tracker.alert_id, None)
        if tracker.node is not None:
            self._by_node.get(tracker.node, set()).discard(tracker.alert_id)

    def _gone(self, prefix: str, still: set[str], at: datetime) -> list[Change]:
        changes: list[Change] = []
        for alert_id in [a for a in self.trackers if a.startswith(prefix) and a not in still]:
            tracker = self.trackers[alert_id]
            changes += self._step(alert_id, tracker.kind, self._rule(tracker.kind), at, Verdict.GONE)
        return changes

    def _rule(self, kind: str) -> Rule:
        return getattr(self.rules, kind)

    def _cleared_message(self, tracker: Tracker) -> str:
        return CLEARED.get(tracker.kind, "cleared")

    def _gone_message(self, tracker: Tracker) -> str:
        return GONE.get(tracker.kind, "no longer reported")


CLEARED: dict[str, str] = {
    AlertKind.GPU_IDLE: "the GPU is busy again",
    AlertKind.GPU_TEMPERATURE: "the GPU cooled down",
    AlertKind.GPU_POWER: "the GPU's power draw is back under its threshold",
    AlertKind.GPU_XID: "no fatal XID error since",
    AlertKind.JOB_XID: "no application XID error since",
    AlertKind.GPU_ECC: "no uncorrectable ECC error any more (reset)",
    AlertKind.GPU_LOST: "the GPU reads again",
    AlertKind.NODE_LOST: "the node's heartbeats are back",
    AlertKind.JOB_WAITING: "the job no longer waits",
    AlertKind.JOB_SILENT: "the job shows signs of life again",
}
GONE: dict[str, str] = {
    AlertKind.GPU_IDLE: "the job let the GPU go",
    AlertKind.JOB_XID: "the job let the GPU go",
    AlertKind.JOB_WAITING: "the job no longer waits (placed, cancelled or gone)",
    AlertKind.JOB_SILENT: "the job no longer runs",
}


def _for(rule: Rule) -> str:
    return format_duration(rule.for_) if rule.for_ else "a sample"
