"""The whole explanation of why a job waits (or where it runs), from its public view: `gpuyard why JOB`, and
the dashboard's job page through `GET /v1/jobs/{id}/why`.

Pure functions of the `JobOut` that GET /v1/jobs/{id} answers and of the current time, so that `why`,
`describe` and `ps` say the same thing and the formatting is testable without a server.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpuyard.shared.contracts.api.jobs import AttemptOut, JobOut, PendingOut, PlacementOut, pending_text
from gpuyard.shared.contracts.events.jobs import lost_work_text
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.contracts.reasons import ordinal
from gpuyard.shared.contracts.units import count_text, format_duration, format_rough_duration, format_size


def exact(seconds: float) -> str:
    """A duration as a job spec writes it: '2h', '1h30m', '90s' -> '1m30s', '1d2h'."""
    left, parts = int(round(seconds)), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def relative_start(when: datetime | None, now: datetime) -> str:
    """'in about 40 min', 'now (the estimate passed 2 min ago)', or 'unknown'."""
    if when is None:
        return "unknown"
    ahead = (when - now).total_seconds()
    if ahead >= 1:
        return f"in about {format_rough_duration(ahead)}"
    if ahead > -1:
        return "now"
    return f"now (the estimate passed {format_rough_duration(-ahead)} ago)"


def position_text(pending: PendingOut | None) -> str:
    """'#3' for the third waiting job, '' when the scheduler gave no position."""
    return f"#{pending.position}" if pending is not None and pending.position else ""


SIZE_KEYS = ("memory", "bytes")
"""A detail whose name is one of these, or ends in `_` and one of them (`gpu_memory`, `free_memory`), counts
bytes: it is shown as a size ('2 GiB'), never as a number of bytes."""


def _is_size(key: str) -> bool:
    return any(key == k or key.endswith(f"_{k}") for k in SIZE_KEYS)


def _number(v: float) -> str:
    """A number as people read it: '3', '0.25', '1.5', '12345' (no exponent, at most three decimals)."""
    if float(v).is_integer():
        return str(int(v))
    return f"{v:.3f}".rstrip("0").rstrip(".") if abs(v) < 1e15 else f"{v:g}"


def _value(v: Any, size: bool = False) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int | float):
        return format_size(v) if size and v >= 0 else _number(v)
    if isinstance(v, list | tuple):
        return ", ".join(_value(x, size) for x in v) or "-"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x, size or _is_size(str(k)))}" for k, x in v.items()) + "}"
    return str(v)


def details_text(details: dict[str, Any]) -> str:
    """A reason's numbers, 'cpus=2 · memory=256 MB · node=n0': byte counts as sizes (`SIZE_KEYS`)."""
    return " · ".join(f"{k}={_value(v, _is_size(k))}" for k, v in details.items())


def gpus_text(spec: JobSpec) -> str:
    per, replicas = spec.resources.gpus, spec.replicas
    if not per:
        return "no GPU"
    each = f"{per:g} of a GPU" if per < 1 else count_text(per, "GPU")
    return f"{replicas} × {each}" if replicas > 1 else each


def resources_text(spec: JobSpec) -> str:
    r = spec.resources
    parts = [gpus_text(spec)]
    if r.gpu_memory:
        parts.append(f"{format_size(r.gpu_memory)} GPU memory")
    if r.gpu_model:
        parts.append(f"model {' or '.join(r.gpu_model)}")
    per_replica = " per replica" if spec.replicas > 1 else ""
    parts.append(f"{count_text(r.cpus, 'CPU')}{per_replica}")
    parts.append(f"{format_size(r.memory)} memory{per_replica}")
    if spec.timeout:
        parts.append(f"time limit {exact(spec.timeout)}")
    return " · ".join(parts)


def placement_text(p: PlacementOut) -> str:
    gpus = []
    for g in p.gpus:
        text = str(g.index)
        if g.fraction < 1:
            text += f" (×{g.fraction:g}" + (f", {format_size(g.memory_bytes)})" if g.memory_bytes else ")")
        gpus.append(text)
    parts = [p.node + (f" GPU {', '.join(gpus)}" if gpus else " (no GPU)")]
    if p.cpus:
        parts.append(f"{p.cpus:g} CPU{'s' if p.cpus != 1 else ''}")
    if p.memory_bytes:
        parts.append(format_size(p.memory_bytes))
    return " · ".join(parts)


def _previous_attempts(job: JobOut) -> list[AttemptOut]:
    return [a for a in job.attempts if a.number != job.attempt]


def _current_attempt(job: JobOut) -> AttemptOut | None:
    return next((a for a in job.attempts if a.number == job.attempt), None)


def summary(job: JobOut, now: datetime) -> str:
    """One sentence: why the job waits, or where it runs, or how it ended."""
    state = job.state
    if state == JobState.QUEUED:
        if job.cancel_requested:
            return "cancel requested; it will not be placed"
        if job.pending:
            return f"waiting: {pending_text(job.pending)}"
        return (
            "queued, waiting its turn for busy resources (the scheduler stores the details once it has waited "
            "a few seconds; a job that cannot run soon gets its reason within a cycle, about a second)"
        )
    nodes = sorted({p.node for p in job.placements})
    on = f" on {', '.join(nodes)}" if nodes else ""
    if not state.terminal:
        if job.cancel_requested:
            return f"{state}{on}; cancel requested, the executor is stopping it"
        pre = job.preemption
        if pre:
            by = f" by job {pre.by_job}" if pre.by_job else ""
            return (
                f"{state}{on}, being preempted ({pre.reason}){by}; it is stopped within "
                f"{format_rough_duration(pre.grace_seconds)} and queued again as attempt {job.attempt + 1}"
            )
        if state == JobState.PLACED:
            return f"placed{on}; the executor is starting it"
        since = f" for {format_duration((now - job.started_at).total_seconds())}" if job.started_at else ""
        return f"running{on}{since}"
    text = f"not waiting: it has {state}" if state != JobState.CANCELLED else "not waiting: it was cancelled"
    if job.failure and job.failure.exit_code is not None:
        text += f" with exit code {job.failure.exit_code}"
    return text + (f" ({job.message})" if job.message else "")


def explain(job: JobOut, now: datetime | None = None) -> tuple[str, list[tuple[str, str]]]:
    """The summary sentence and (label, value) rows for `gpuyard why`."""
    now = now or datetime.now(UTC)
    spec = job.spec
    rows: list[tuple[str, str]] = [
        ("Job", f"{job.job_id} ({job.name})"),
        ("State", f"{job.state} · attempt {job.attempt}"),
        ("Tenant / user", f"{job.tenant} / {job.user}"),
        ("Priority", spec.priority),
        ("Asks", resources_text(spec)),
    ]
    pending = job.pending
    if job.state == JobState.QUEUED:
        current = _current_attempt(job)
        if current:
            rows.append(("Waiting for", format_duration((now - current.queued_at).total_seconds())))
        if pending:
            rows.append(("Reason", pending_text(pending)))
            rows.append(("Meaning", pending.code.meaning))
            if pending.details:
                rows.append(("Numbers", details_text(pending.details)))
            position = pending.position
            rows.append(("Queue position", f"#{position} ({ordinal(position)} in line)" if position else "-"))
            start = relative_start(pending.estimated_start, now)
            if pending.estimated_start:
                start += f" ({pending.estimated_start.isoformat()})"
            rows.append(("Estimated start", start))
        if job.not_before and job.not_before > now:
            rows.append(
                ("Retry backoff", f"not before {relative_start(job.not_before, now).removeprefix('in ')}")
            )
    for p in job.placements:
        rows.append((f"Replica {p.replica}", placement_text(p)))
    pre = job.preemption
    if pre:
        by = f" by job {pre.by_job}" if pre.by_job else ""
        lost = lost_work_text(pre.lost_work_seconds)
        grace = f"grace {format_rough_duration(pre.grace_seconds)}"
        rows.append(("Preempted", f"{pre.reason}{by} · {grace}" + (f" · {lost}" if lost else "")))
    if job.failure:
        rows.append(("Failure", failure_text(job)))
    elif job.state.terminal and job.message:
        rows.append(("Message", job.message))
    for a in _previous_attempts(job):
        outcome = a.summary or "in progress"
        rows.append((f"Attempt {a.number}", outcome + (f" ({a.message})" if a.message else "")))
    return summary(job, now), rows


def failure_text(job: JobOut) -> str:
    """'exit_code: exited with 3 · exit code 3 · replica 1', '' for a job that did not fail."""
    f = job.failure
    if f is None:
        return ""
    parts = [f"{f.reason}: {f.message}" if f.message else str(f.reason)]
    if f.exit_code is not None:
        parts.append(f"exit code {f.exit_code}")
    if f.signal is not None:
        parts.append(f"signal {f.signal}")
    if f.replica is not None:
        parts.append(f"replica {f.replica}")
    return " · ".join(parts)


def as_dict(job: JobOut, now: datetime | None = None) -> dict[str, Any]:
    """`gpuyard why --json`: the same explanation, machine-readable."""
    now = now or datetime.now(UTC)
    spec, pending = job.spec, job.pending
    out_pending = None
    if pending:
        est = pending.estimated_start
        out_pending = {
            **pending.model_dump(mode="json"),
            "text": pending_text(pending),
            "meaning": pending.code.meaning,
            "estimated_start_in_seconds": round((est - now).total_seconds(), 1) if est else None,
            "estimated_start_text": relative_start(est, now),
        }
    return {
        "job_id": job.job_id,
        "name": job.name,
        "state": job.state.value,
        "attempt": job.attempt,
        "summary": summary(job, now),
        "tenant": job.tenant,
        "user": job.user,
        "priority": spec.priority,
        "resources": {
            **spec.resources.model_dump(mode="json"),
            "replicas": spec.replicas,
            "total_gpus": job.gpus,
            "timeout": spec.timeout,
        },
        "pending": out_pending,
        "placements": [p.model_dump(mode="json") for p in job.placements],
        "preemption": job.preemption.model_dump(mode="json") if job.preemption else None,
        "failure": job.failure.model_dump(mode="json") if job.failure else None,
        "cancel_requested": job.cancel_requested,
        "previous_attempts": [a.model_dump(mode="json") for a in _previous_attempts(job)],
    }
