"""Idle-GPU reclaim, the decision: pure functions and a small per-attempt record, no I/O (the service part is
`gpuyard.services.monitor.idlereclaim`).

As dstack's `utilization_policy`: a job's GPUs are idle when EVERY sample of EVERY GPU it holds, over its whole
idle timeout (the window), reads under the threshold; the samples of its first `min_age` seconds (its start-up:
loading data, compiling) do not count, so the earliest warning comes `min_age + timeout` after its start. An
idle job is warned; still idle `grace` seconds after the warning, it is stopped; a busy sample meanwhile
withdraws the warning.

The window is judged on the samples' own times, never on the clock: no samples (a node's monitor away) never
make a job idle, and a gap of more than `max_gap` between two samples starts the window over.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum

from gpuyard.shared.contracts.units import format_duration

GAP_SAMPLES = 5
"""Samples a node may miss before its jobs' windows start over (their GPUs were not seen meanwhile)."""


@dataclass(frozen=True, slots=True)
class IdlePolicy:
    """One job's idle reclaim: its timeout (the window) and grace, the platform's threshold and allowance."""

    timeout: float
    grace: float
    threshold_pct: float
    min_age: float


def policy_for(
    idle_timeout: float | None,
    idle_grace: float | None,
    tenant: str,
    *,
    tenant_timeouts: dict[str, float],
    default_grace: float,
    threshold_pct: float,
    min_age: float,
) -> IdlePolicy | None:
    """A job's policy: its spec's `idle_timeout`, else its tenant's default (`*`: every other tenant's); None
    when it has none or it is 0 (off)."""
    timeout = idle_timeout
    if timeout is None:
        timeout = tenant_timeouts.get(tenant, tenant_timeouts.get("*"))
    if not timeout:
        return None
    grace = default_grace if idle_grace is None else idle_grace
    return IdlePolicy(timeout=timeout, grace=grace, threshold_pct=threshold_pct, min_age=min_age)


class Verdict(Enum):
    NOTHING = "nothing"
    WARN = "warn"
    STOP = "stop"
    WITHDRAW = "withdraw"


@dataclass(frozen=True, slots=True)
class Finding:
    """What a verdict is based on: the figures the warning, the stop and the job's failure message show."""

    verdict: Verdict
    idle_since: datetime | None = None
    """Since when every sample has read under the threshold (within the counted samples)."""
    idle_seconds: float = 0.0
    max_utilization_pct: float = 0.0
    """The highest utilization of the job's GPUs over the last `timeout` seconds (idle: under the threshold)."""


@dataclass(slots=True)
class IdleWatch:
    """One running attempt's samples, as far as the decision needs them: when its counted samples began, the
    last busy one, and the running maximum of the idle ones over the window (a monotonic queue: a few entries,
    not one per sample)."""

    job_id: str
    attempt: int
    started_at: datetime
    first_at: datetime | None = None
    """The first counted sample (after the start-up allowance, or after a gap)."""
    last_at: datetime | None = None
    busy_at: datetime | None = None
    """The last sample at or above the threshold (or the last activity of a dev environment's user)."""
    peaks: deque[tuple[datetime, float]] = field(default_factory=deque)
    """(time, utilization) of idle samples, utilizations decreasing: the first is the window's maximum."""
    warned_at: datetime | None = None
    """When the warning was given (None: not warned, or withdrawn)."""
    stopped: bool = False

    def observe(self, at: datetime, utilization_pct: float, policy: IdlePolicy, *, max_gap: float) -> None:
        """One sample of the job's GPUs at `at`: the highest utilization of those it holds on one node."""
        if (at - self.started_at).total_seconds() < policy.min_age:
            return  # its start-up: not counted
        if self.last_at is not None and (at - self.last_at).total_seconds() > max_gap:
            self.first_at, self.busy_at = at, None  # not seen for a while: the window starts over
            self.peaks.clear()
        if self.first_at is None or at < self.first_at:
            self.first_at = at
        if utilization_pct >= policy.threshold_pct:
            if self.busy_at is None or at > self.busy_at:
                self.busy_at = at
            while self.peaks and self.peaks[0][0] <= at:
                self.peaks.popleft()  # idle samples before a busy one are out of every window to come
        elif self.busy_at is None or at > self.busy_at:
            self._push(at, utilization_pct)
        if self.last_at is None or at > self.last_at:
            self.last_at = at
        horizon = self.last_at - timedelta(seconds=policy.timeout)
        while self.peaks and self.peaks[0][0] < horizon:
            self.peaks.popleft()

    def active(self, at: datetime) -> None:
        """The job was busy at `at` for another reason than its GPUs (a user's activity in a dev environment):
        as a busy sample at `at` (the window starts over there), without being a sample (its time neither
        starts nor ends the samples seen). An older time than the last busy one changes nothing."""
        if self.busy_at is not None and at <= self.busy_at:
            return
        self.busy_at = at
        while self.peaks and self.peaks[0][0] <= at:
            self.peaks.popleft()

    def _push(self, at: datetime, utilization_pct: float) -> None:
        if self.peaks and at < self.peaks[-1][0]:  # a late sample (another node's): put in its place
            entries = sorted([*self.peaks, (at, utilization_pct)])
            self.peaks.clear()
            for entry in entries:
                self._push(*entry)
            return
        while self.peaks and self.peaks[-1][1] <= utilization_pct:
            self.peaks.pop()
        self.peaks.append((at, utilization_pct))


def judge(watch: IdleWatch, policy: IdlePolicy) -> Finding:
    """What to do now about the attempt, from its samples (as of its latest one) and whether it was warned:

    - WARN: not warned, and every counted sample of the last `timeout` seconds is idle (none busy, none
      missed, none of its start-up);
    - STOP: warned, still idle, and `grace` seconds have passed since the warning;
    - WITHDRAW: warned, and no longer idle (a busy sample, or the window started over);
    - NOTHING otherwise (a stopped attempt stays stopped)."""
    if watch.stopped or watch.last_at is None or watch.first_at is None:
        return Finding(Verdict.NOTHING)
    since = watch.first_at if watch.busy_at is None else max(watch.first_at, watch.busy_at)
    idle_seconds = (watch.last_at - since).total_seconds()
    idle = idle_seconds >= policy.timeout
    peak = watch.peaks[0][1] if watch.peaks else 0.0
    found = Finding(Verdict.NOTHING, since, idle_seconds, peak)
    if watch.warned_at is None:
        return Finding(Verdict.WARN, since, idle_seconds, peak) if idle else found
    if not idle:
        return Finding(Verdict.WITHDRAW, since, idle_seconds, peak)
    if (watch.last_at - watch.warned_at).total_seconds() >= policy.grace:
        return Finding(Verdict.STOP, since, idle_seconds, peak)
    return found


def warning_text(policy: IdlePolicy, finding: Finding) -> str:
    """'GPUs below 5% for 30m (highest 1.2%); stopping in 10m unless they get busy'."""
    return (
        f"GPUs below {policy.threshold_pct:g}% for {format_duration(policy.timeout)} "
        f"(highest {finding.max_utilization_pct:.1f}%); stopping in {format_duration(policy.grace)} "
        "unless they get busy"
    )


def stop_text(policy: IdlePolicy, finding: Finding) -> str:
    """The stopped job's failure message, with the figures that stopped it."""
    return (
        f"stopped for idle GPUs: every sample under {policy.threshold_pct:g}% utilization for "
        f"{format_duration(finding.idle_seconds)} (idle timeout {format_duration(policy.timeout)}, grace "
        f"{format_duration(policy.grace)}; highest {finding.max_utilization_pct:.1f}% over the last "
        f"{format_duration(policy.timeout)})"
    )
