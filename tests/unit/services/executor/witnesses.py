"""Positive witnesses for the executor tests' "it changed nothing" checks: instead of sleeping and then looking,
a test delivers a legitimate marker after the event that must change nothing, waits until the marker's effect
is seen, and only then checks that the earlier event left no trace.

The harness delivers one event at a time: `Harness.deliver` returns once the executor's `handlers` have (a
launch is awaited up to its `job.started` record, a stop up to the replica's end or the grace's SIGKILL). So
whatever the executor does about an event is done, or marked on the attempt's record (a stop's reason), before
the next event reaches it; the marker's effect shows from outside that the executor got that far, whatever
the machine's speed."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path

from gpuyard.services.executor.executor import NOTE
from gpuyard.shared.contracts.events.alerts import IdleWarning
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.runtime.paths import replica_files
from gpuyard.shared.stores.readmodels import idlebook

from .harness import Harness

MARKER = "marker: the attempt runs and nothing stops it"
"""The message of the idle warning `runs_unstopped` delivers, as the job's output then shows it."""


def output(h: Harness, job: str, attempt: int = 1, replica: int = 0) -> str:
    """The replica's output on this node, the executor's own lines among it."""
    return Path(replica_files(h.data_dir, job, attempt, replica).log).read_text()


def notes(h: Harness, job: str, attempt: int = 1) -> list[str]:
    """The lines the executor wrote into replica 0's output."""
    return [line for line in output(h, job, attempt).splitlines() if line.startswith(NOTE)]


async def runs_unstopped(h: Harness, ex, job: str, attempt: int = 1) -> None:
    """Return once a recorded idle warning, delivered to `ex` after everything the test delivered before, has
    written its line into the job's output. The executor writes that line only for an attempt it runs and is
    not stopping (`Executor.idle_attempt`: a warning for an attempt that is over, or being stopped, is a late one),
    so nothing delivered before it stopped or ended the attempt. (It leaves a warning in the job's idle
    stream, which only an `idle.stop` acts on.)"""
    warning = IdleWarning(
        job_id=job, attempt=attempt, tenant="team", user="ana", threshold_pct=5.0, window_seconds=10.0,
        max_utilization_pct=0.4, grace_seconds=5, stop_at=datetime.now(UTC), message=MARKER,
    )  # fmt: skip
    event = make_event(warning, source="/gpuyard/monitor/test")
    await idlebook.record(h.store, event)
    await ex.handlers(event)
    await h.wait_for(
        lambda: f"{NOTE}idle: {MARKER}" in output(h, job, attempt),
        what=f"the marker in job {job}'s output (none: the attempt was stopped or ended before it)",
    )


async def running_marker_job(h: Harness, ex) -> str:
    """A job of its own placed on `ex` after everything the test delivered before, once it runs: the executor
    launches placements in the order they reach it, so an earlier placement it had taken on would have been
    started (its `job.started` recorded) by then."""
    job = await h.submit(command="sleep 60")
    await h.place(ex, job)
    await h.wait(job, "running")
    return job


def job_sessions(job: str) -> set[int]:
    """The sessions of the live processes that carry the job's id in their environment (from /proc). Each
    replica the executor starts is a session of its own, there as soon as its start is recorded (the reaper
    answers once the replica has exec'd), so a replica started twice shows as two sessions."""
    needle = f"GPUYARD_JOB_ID={job}".encode()
    sessions = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile, or another user's
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, session, ...
        if fields[0] != "Z":
            sessions.add(int(fields[3]))
    return sessions
