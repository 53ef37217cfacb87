"""Following a job's events until it ends (used by `submit --follow` and the demo)."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any

from rich.console import Console

from gpuyard.client import Client, ClientError
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.jobs import (
    JobCheckpointed,
    JobExecStarted,
    JobFailed,
    JobPending,
    JobPlaced,
    JobPreempted,
    JobReplicaExited,
    JobRequeued,
    JobStarted,
    lost_work_text,
)
from gpuyard.shared.contracts.jobstate import IllegalTransition, JobState, apply
from gpuyard.shared.contracts.units import format_size

OUTPUT_WAIT = 30.0
"""Seconds the job's end waits for its replicas' output streams, which end as soon as the API sees the job
ended: only an API that stops answering meanwhile makes it wait that long."""


def parse_event(raw: dict[str, Any]) -> CloudEvent | None:
    """A stored event as its typed model; None for one this CLI does not know (a newer server's)."""
    try:
        return CloudEvent.model_validate(raw)
    except ValueError:
        return None


def exit_text(exit_code: int | None, sig: int | None) -> str:
    """'exit 3', 'signal 9 (SIGKILL)', or 'no exit status' (a replica whose process was lost with its node)."""
    if exit_code is not None:
        return f"exit {exit_code}"
    if sig is None:
        return "no exit status"
    try:
        return f"signal {sig} ({signal.Signals(sig).name})"
    except ValueError:
        return f"signal {sig}"


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
            return f"replica {d.replica} exited ({exit_text(d.exit_code, d.signal)}){': ' + d.message if d.message else ''}"
        case JobFailed() as d:
            return f"failed: {d.message}"
        case JobPreempted() as d:
            by = f" by job {d.by_job}" if d.by_job else ""
            said = f"preempted ({d.text}){by}: stopping within {d.grace_seconds:g}s"
            lost = lost_work_text(d.lost_work_seconds)
            return f"{said}; {lost}" if lost else said
        case JobStarted() as d:
            return f"started on {d.node} (replicas {', '.join(map(str, d.replicas))})"
        case JobRequeued() as d:
            return f"requeued as attempt {d.attempt} ({d.reason}): {d.message}"
        case JobCheckpointed() as d:
            return f"checkpoint at step {d.step} ({format_size(d.size_bytes)}, attempt {d.attempt})"
        case JobExecStarted() as d:
            what = "a shell" if not d.command else " ".join(d.command)
            return f"{d.by} opened {what} in replica {d.replica} on {d.node}"
    return event.nats_subject.value.split(".", 1)[-1]


def event_line(raw: dict[str, Any]) -> str:
    """'12:00:01.250  placed (attempt 1): r0→n1[0]'; an event this CLI does not know: its time and type."""
    event = parse_event(raw)
    if event is None:
        return f"{str(raw.get('time', ''))[11:23]}  {raw.get('type', 'unknown event')}"
    return f"{event.time.strftime('%H:%M:%S.%f')[:12]}  {describe_event(event)}"


class ReplicaOutput:
    """A job's output as it comes, one thread per replica following its log, printed line by line; with several
    replicas each line is prefixed with its replica (`r1 | …`), as `docker compose up` prefixes services."""

    def __init__(self, client: Client, job_id: str, console: Console, replicas: int):
        self.client, self.job_id, self.console, self.replicas = client, job_id, console, replicas
        self.lock = threading.Lock()
        self.threads: list[tuple[int, threading.Thread]] = []
        self.attempts: set[int] = set()
        self.closed = False  # once the job's end is printed, a late line would come after it: none is printed

    def start(self, attempt: int) -> None:
        """Follow every replica of `attempt` (once); each stream ends when the attempt does."""
        if attempt in self.attempts:
            return
        self.attempts.add(attempt)
        for replica in range(self.replicas):
            t = threading.Thread(target=self._follow, args=(attempt, replica), daemon=True)
            t.start()
            self.threads.append((replica, t))

    def _follow(self, attempt: int, replica: int) -> None:
        prefix = f"r{replica} | " if self.replicas > 1 else ""
        pending = b""
        try:
            for chunk in self.client.follow_logs(self.job_id, replica=replica, attempt=attempt):
                *lines, pending = (pending + chunk).split(b"\n")
                self._print(prefix, lines)
        except ClientError as exc:
            self._print("", [f"(no output of replica {replica}: {exc})".encode()])
        if pending:
            self._print(prefix, [pending])

    def _print(self, prefix: str, lines: list[bytes]) -> None:
        with self.lock:
            if self.closed:
                return
            for raw in lines:
                text = raw.decode(errors="replace")
                self.console.print(f"{prefix}{text}", markup=False, highlight=False, soft_wrap=True)

    def wait(self, timeout: float = OUTPUT_WAIT) -> None:
        """Until every replica's output shipped before the job ended has been printed: the caller prints the
        job's end after it. A stream still open after `timeout` (the API unreachable meanwhile) is said, and
        what it brings later is not printed, so that nothing comes after the job's end."""
        if self.closed:
            return
        deadline = time.monotonic() + timeout
        for _, t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self.lock:
            self.closed = True
            late = sorted({replica for replica, t in self.threads if t.is_alive()})
            for replica in late:
                self.console.print(
                    f"(replica {replica}: the rest of its output has not come yet; "
                    f"`gpuyard logs {self.job_id} --replica {replica}` shows it)",
                    markup=False,
                    highlight=False,
                )


def follow_job(
    client: Client,
    job_id: str,
    console: Console,
    poll: float = 0.3,
    quiet: bool = False,
    logs: bool = False,
) -> JobState:
    """Print each event of the job, up to and including the one that ends it, and returns the final state. The
    job's state is folded from the events printed (the state machine's own `apply`), so no event that came
    before the end is missed. `logs`: also print the replicas' output as it comes, all of it before the event
    that ends the job (the replicas' streams are read by threads, which may be behind the events)."""
    after, view, output, known = 0, None, None, True

    def show(raw: dict[str, Any], ends: bool = False) -> None:
        if ends and output is not None:
            output.wait()
        if not quiet:
            console.print(f"  {event_line(raw)}", highlight=False)

    while True:
        for item in client.events(job_id, after=after):
            after = item.version
            event = parse_event(item.event)
            try:
                view = apply(view, event, version=item.version) if event is not None else view
            except IllegalTransition:
                event = None
            show(item.event, ends=event is not None and known and view is not None and view.state.terminal)
            if event is None:  # a newer server's event: from here on, the server says when the job ends
                known = False
                continue
            if logs and isinstance(event.data, JobStarted) and view is not None:
                output = output or ReplicaOutput(client, job_id, console, view.spec.replicas)
                output.start(event.data.attempt)
        state = view.state if known and view is not None else None
        if not known and (state := client.job(job_id).state).terminal:
            if output is not None:
                output.wait()
            for item in client.events(job_id, after=after):  # what came before the state was read
                show(item.event)
        if state is not None and state.terminal:
            if output is not None:
                output.wait()  # (done already, unless the job ended by an event this CLI does not know)
            return state
        time.sleep(poll)
