"""`gpuyard why JOB`: the whole explanation of why a job waits (or where it runs), from its job view.

Pure functions of the view that GET /v1/jobs/{id} returns and of the current time, so that `why`, `describe`
and `ps` say the same thing and the formatting is testable without a server.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from shared.units import format_duration, format_rough_duration, format_size

WAITING, ACTIVE, TERMINAL = "queued", {"placed", "running"}, {"succeeded", "failed", "cancelled"}


def parse_time(value: str | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def exact(seconds: float) -> str:
    """A duration as a job spec writes it: '2h', '1h30m', '90s' -> '1m30s', '1d2h'."""
    left, parts = int(round(seconds)), []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def relative_start(estimated: str | datetime | None, now: datetime) -> str:
    """'in about 40 min', 'now (the estimate passed 2 min ago)', or 'unknown'."""
    when = parse_time(estimated)
    if when is None:
        return "unknown"
    ahead = (when - now).total_seconds()
    if ahead >= 1:
        return f"in about {format_rough_duration(ahead)}"
    if ahead > -1:
        return "now"
    return f"now (the estimate passed {format_rough_duration(-ahead)} ago)"


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def position_text(pending: dict[str, Any] | None) -> str:
    """'#3' for the third waiting job, '' when the scheduler gave no position."""
    position = (pending or {}).get("position")
    return f"#{position}" if position else ""


def _value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, list | tuple):
        return ", ".join(_value(x) for x in v) or "-"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_value(x)}" for k, x in v.items()) + "}"
    return str(v)


def details_text(details: dict[str, Any] | None) -> str:
    return " · ".join(f"{k}={_value(v)}" for k, v in (details or {}).items())


def size_text(num_bytes: int) -> str:
    """Bytes in the unit they were most likely written in: 16 GB stays '16 GB', 16 GiB stays '16 GiB'."""
    units = (("TiB", 2**40), ("TB", 10**12), ("GiB", 2**30), ("GB", 10**9), ("MiB", 2**20), ("MB", 10**6))
    for unit, factor in units:
        if num_bytes >= factor and num_bytes % factor == 0:
            return f"{num_bytes // factor} {unit}"
    return format_size(num_bytes)


def gpus_text(spec: dict[str, Any]) -> str:
    per, replicas = spec["resources"]["gpus"], spec["replicas"]
    if not per:
        return "no GPU"
    each = f"{per:g} of a GPU" if per < 1 else f"{per:g} GPU" + ("s" if per != 1 else "")
    return f"{replicas} × {each}" if replicas > 1 else each


def resources_text(spec: dict[str, Any]) -> str:
    r = spec["resources"]
    parts = [gpus_text(spec)]
    if r.get("gpu_memory"):
        parts.append(f"{size_text(r['gpu_memory'])} GPU memory")
    if r.get("gpu_model"):
        parts.append(f"model {' or '.join(r['gpu_model'])}")
    per_replica = " per replica" if spec["replicas"] > 1 else ""
    parts.append(f"{r['cpus']:g} CPU{'s' if r['cpus'] != 1 else ''}{per_replica}")
    parts.append(f"{size_text(r['memory'])} memory{per_replica}")
    if spec.get("timeout"):
        parts.append(f"time limit {exact(spec['timeout'])}")
    return " · ".join(parts)


def placement_text(p: dict[str, Any]) -> str:
    gpus = []
    for g in p.get("gpus", []):
        text = str(g["index"])
        if g.get("fraction", 1) < 1:
            text += f" (×{g['fraction']:g}" + (
                f", {size_text(g['memory_bytes'])})" if g.get("memory_bytes") else ")"
            )
        gpus.append(text)
    where = p["node"] + (f" GPU {', '.join(gpus)}" if gpus else " (no GPU)")
    parts = [where]
    if p.get("cpus"):
        parts.append(f"{p['cpus']:g} CPU{'s' if p['cpus'] != 1 else ''}")
    if p.get("memory_bytes"):
        parts.append(size_text(p["memory_bytes"]))
    return " · ".join(parts)


def _previous_attempts(job: dict[str, Any]) -> list[dict[str, Any]]:
    return [a for a in job.get("attempts", []) if a["number"] != job["attempt"]]


def summary(job: dict[str, Any], now: datetime) -> str:
    """One sentence: why the job waits, or where it runs, or how it ended."""
    state, pending = job["state"], job.get("pending")
    if state == WAITING:
        if job.get("cancel_requested"):
            return "cancel requested; it will not be placed"
        if pending:
            return f"waiting ({pending['code']}): {pending['message']}"
        return (
            "queued, waiting its turn for busy resources (the scheduler stores the details once it has waited "
            "a few seconds; a job that cannot run soon gets its reason within a cycle, about a second)"
        )
    nodes = sorted({p["node"] for p in job.get("placements", [])})
    on = f" on {', '.join(nodes)}" if nodes else ""
    if state in ACTIVE:
        if job.get("cancel_requested"):
            return f"{state}{on}; cancel requested, the executor is stopping it"
        pre = job.get("preempt_requested")
        if pre:
            by = f" by job {pre['by_job']}" if pre.get("by_job") else ""
            return (
                f"{state}{on}, being preempted ({pre['reason']}){by}; it is stopped within "
                f"{format_rough_duration(pre.get('grace_seconds') or 0)} and queued again as attempt {job['attempt'] + 1}"
            )
        if state == "placed":
            return f"placed{on}; the executor is starting it"
        started = parse_time(job.get("started_at"))
        since = f" for {format_duration((now - started).total_seconds())}" if started else ""
        return f"running{on}{since}"
    text = f"not waiting: it has {state}" if state != "cancelled" else "not waiting: it was cancelled"
    if state == "failed" and job.get("exit_code") is not None:
        text += f" with exit code {job['exit_code']}"
    return text + (f" ({job['message']})" if job.get("message") else "")


def explain(job: dict[str, Any], now: datetime | None = None) -> tuple[str, list[tuple[str, str]]]:
    """The summary sentence and (label, value) rows for `gpuyard why`."""
    now = now or datetime.now(UTC)
    spec = job["spec"]
    rows: list[tuple[str, str]] = [
        ("Job", f"{job['job_id']} ({job['name']})"),
        ("State", f"{job['state']} · attempt {job['attempt']}"),
        ("Tenant / user", f"{job['tenant']} / {job['user']}"),
        ("Priority", spec["priority"]),
        ("Asks", resources_text(spec)),
    ]
    pending = job.get("pending")
    if job["state"] == WAITING:
        current = next((a for a in job.get("attempts", []) if a["number"] == job["attempt"]), None)
        queued_at = parse_time(current["queued_at"]) if current else None
        if queued_at:
            rows.append(("Waiting for", format_duration((now - queued_at).total_seconds())))
        if pending:
            rows.append(("Reason", pending["code"]))
            rows.append(("Message", pending["message"]))
            if pending.get("details"):
                rows.append(("Numbers", details_text(pending["details"])))
            position = pending.get("position")
            rows.append(("Queue position", f"#{position} ({ordinal(position)} in line)" if position else "-"))
            start = relative_start(pending.get("estimated_start"), now)
            if pending.get("estimated_start"):
                start += f" ({pending['estimated_start']})"
            rows.append(("Estimated start", start))
        not_before = parse_time(job.get("not_before"))
        if not_before and not_before > now:
            rows.append(
                ("Retry backoff", f"not before {relative_start(not_before, now).removeprefix('in ')}")
            )
    for p in job.get("placements", []):
        rows.append((f"Replica {p['replica']}", placement_text(p)))
    pre = job.get("preempt_requested")
    if pre and job["state"] in ACTIVE:
        by = f" by job {pre['by_job']}" if pre.get("by_job") else ""
        rows.append(
            (
                "Preempted",
                f"{pre['reason']}{by} · grace {format_rough_duration(pre.get('grace_seconds') or 0)}",
            )
        )
    if job["state"] in TERMINAL:
        if job.get("exit_code") is not None:
            rows.append(("Exit code", str(job["exit_code"])))
        if job.get("message"):
            rows.append(("Message", job["message"]))
    for a in _previous_attempts(job):
        outcome = a.get("outcome") or "in progress"
        rows.append((f"Attempt {a['number']}", outcome + (f" ({a['message']})" if a.get("message") else "")))
    return summary(job, now), rows


def as_dict(job: dict[str, Any], now: datetime | None = None) -> dict[str, Any]:
    """`gpuyard why --json`: the same explanation, machine-readable."""
    now = now or datetime.now(UTC)
    spec, pending = job["spec"], job.get("pending")
    out_pending = None
    if pending and job["state"] == WAITING:
        est = parse_time(pending.get("estimated_start"))
        out_pending = {
            **pending,
            "estimated_start_in_seconds": round((est - now).total_seconds(), 1) if est else None,
            "estimated_start_text": relative_start(est, now),
        }
    return {
        "job_id": job["job_id"],
        "name": job["name"],
        "state": job["state"],
        "attempt": job["attempt"],
        "summary": summary(job, now),
        "tenant": job["tenant"],
        "user": job["user"],
        "priority": spec["priority"],
        "resources": {
            **spec["resources"],
            "replicas": spec["replicas"],
            "total_gpus": spec["resources"]["gpus"] * spec["replicas"],
            "timeout": spec.get("timeout"),
        },
        "pending": out_pending,
        "placements": job.get("placements", []) if job["state"] in ACTIVE else [],
        "preemption": job.get("preempt_requested") if job["state"] in ACTIVE else None,
        "cancel_requested": job.get("cancel_requested", False),
        "previous_attempts": _previous_attempts(job),
    }
