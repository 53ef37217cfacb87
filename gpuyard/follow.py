"""Following a job's events until it ends (used by `submit --follow` and the demo)."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from gpuyard.client import Client
from shared.events import (
    CloudEvent,
    JobFailed,
    JobPending,
    JobPlaced,
    JobPreempted,
    JobReplicaExited,
    JobRequeued,
    JobStarted,
)
from shared.jobstate import JobState


def parse_event(raw: dict[str, Any]) -> CloudEvent | None:
    """A stored event as its typed model; None for one this CLI does not know (a newer server's)."""
    try:
        return CloudEvent.model_validate(raw)
    except ValueError:
        return None


def describe_event(event: CloudEvent) -> str:
    """One readable line for an event."""
    match event.data:
        case JobPlaced() as d:
            where = ", ".join(
                f"r{p.replica}→{p.node}" + (f"[{','.join(str(g.index) for g in p.gpus)}]" if p.gpus else "")
                for p in d.placements
            )
            return f"placed (attempt {d.attempt}): {where}"
        case JobPending() as d:
            return f"waiting: {d.reason.message}"
        case JobReplicaExited() as d:
            how = f"exit {d.exit_code}" if d.exit_code is not None else f"signal {d.signal}"
            return f"replica {d.replica} exited ({how}){': ' + d.message if d.message else ''}"
        case JobFailed() as d:
            return f"failed: {d.message}"
        case JobPreempted() as d:
            by = f" by job {d.by_job}" if d.by_job else ""
            return f"preempted ({d.reason}){by}: stopping within {d.grace_seconds:g}s"
        case JobStarted() as d:
            return f"started on {d.node} (replicas {', '.join(map(str, d.replicas))})"
        case JobRequeued() as d:
            return f"requeued as attempt {d.attempt} ({d.reason}): {d.message}"
    return event.nats_subject.value.split(".", 1)[-1]


def event_line(raw: dict[str, Any]) -> str:
    """'12:00:01.250  placed (attempt 1): r0→n1[0]'; an event this CLI does not know: its time and type."""
    event = parse_event(raw)
    if event is None:
        return f"{str(raw.get('time', ''))[11:23]}  {raw.get('type', 'unknown event')}"
    return f"{event.time.strftime('%H:%M:%S.%f')[:12]}  {describe_event(event)}"


def follow_job(
    client: Client, job_id: str, console: Console, poll: float = 0.3, quiet: bool = False
) -> JobState:
    """Print each new event of the job until it reaches a final state; returns that state."""
    after = 0
    while True:
        for item in client.events(job_id, after=after):
            after = item.version
            if not quiet:
                console.print(f"  {event_line(item.event)}", highlight=False)
        state = client.job(job_id).state
        if state.terminal:
            return state
        time.sleep(poll)
