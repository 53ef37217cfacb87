"""The executor's part of the idle-GPU reclaim: the monitor's `idle.warning` becomes a line in the job's output,
its `idle.stop` stops the attempt as a preemption does (SIGTERM, the grace, SIGKILL) and the job ends `failed`,
reason `idle`, with the monitor's figures, never retried; an idle event the store does not hold (forged), or
one of another attempt, changes nothing."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from gpuyard.shared.contracts.events.alerts import IdleStop, IdleWarning
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import FailureReason
from gpuyard.shared.stores.readmodels import idlebook

from .test_executor_local import crash
from .witnesses import MARKER, notes, output, runs_unstopped

FIGURES = {
    "tenant": "team",
    "user": "ana",
    "threshold_pct": 5.0,
    "window_seconds": 10.0,
    "max_utilization_pct": 0.4,
}


def warning(job: str, attempt: int = 1) -> IdleWarning:
    return IdleWarning(
        job_id=job, attempt=attempt, **FIGURES, grace_seconds=5, stop_at=datetime.now(UTC),
        message="GPUs below 5% for 10s (highest 0.4%); stopping in 5s unless they get busy",
    )  # fmt: skip


def stop(job: str, attempt: int = 1) -> IdleStop:
    return IdleStop(
        job_id=job, attempt=attempt, **FIGURES, idle_seconds=15,
        message="stopped for idle GPUs: every sample under 5% utilization for 15s",
    )  # fmt: skip


async def recorded(h, ex, data) -> None:
    """As the monitor does: recorded in the job's idle stream, then delivered."""
    event = make_event(data, source="/gpuyard/monitor/test")
    await idlebook.record(h.store, event)
    await ex.handlers(event)


async def forged(ex, data) -> None:
    await ex.handlers(make_event(data, source="/forger"))


# a job that checkpoints on SIGTERM and exits 0: it still ends `failed`, reason idle
TRAPS = "trap 'echo checkpointed; exit 0' TERM; echo started; while true; do sleep 0.1; done"


async def test_a_warning_is_a_line_in_the_output_and_a_stop_ends_the_job_failed_idle_without_retry(h):
    ex = await h.executor()
    job = await h.submit(command=TRAPS, max_retries=3, resources={"gpus": 1})
    await h.place(ex, job)
    await h.wait(job, "running")
    await h.wait_for(lambda: "started" in output(h, job), what="the job's first line")
    await recorded(h, ex, warning(job))
    await h.wait_for(
        lambda: "[gpuyard] idle: GPUs below 5% for 10s" in output(h, job), what="the warning line"
    )
    await recorded(h, ex, stop(job))
    view = await h.wait(job, "failed")
    assert view.failure_reason == FailureReason.IDLE
    assert view.message == "stopped for idle GPUs: every sample under 5% utilization for 15s"
    assert "requeued" not in await h.types(job) and view.attempt == 1
    text = output(h, job)
    assert (
        "checkpointed" in text and "[gpuyard] idle: stopped for idle GPUs" in text and "SIGTERM now" in text
    )


async def test_forged_or_other_attempts_idle_events_change_nothing(h):
    ex = await h.executor()
    job = await h.submit(command="sleep 30", resources={"gpus": 1})
    await h.place(ex, job)
    await h.wait(job, "running")
    await forged(ex, warning(job))
    await forged(ex, stop(job))
    await recorded(h, ex, stop(job, attempt=2))  # recorded, but not the attempt that runs
    await runs_unstopped(h, ex, job)  # a marker delivered after them: they stopped nothing
    view = await h.view(job)
    assert view.state == "running" and not view.exits
    assert notes(h, job) == [f"[gpuyard] idle: {MARKER}"]  # nor did the forged warning write its line
    await recorded(h, ex, stop(job))
    assert (await h.wait(job, "failed")).failure_reason == FailureReason.IDLE
    await recorded(h, ex, stop(job))  # repeated: nothing more
    assert (await h.types(job)).count("failed") == 1


async def test_an_executor_restarted_while_it_stops_a_job_for_idleness_still_ends_it_idle(h):
    ex = await h.executor()
    stubborn = "trap 'while true; do sleep 0.05; done' TERM; echo started; while true; do sleep 0.05; done"
    job = await h.submit(command=stubborn, max_retries=2, resources={"gpus": 1})
    await h.place(ex, job)
    await h.wait(job, "running")
    await h.wait_for(lambda: "started" in output(h, job), what="the job's first line")
    ex.settings = ex.settings.model_copy(update={"grace_seconds": 60})  # it would wait long for the SIGKILL
    stopping = asyncio.create_task(recorded(h, ex, stop(job)))
    await h.wait_for(lambda: ex.attempts.get((job, 1)).stop_reason == "idle", what="the stop")
    crash(ex)  # between its SIGTERM and the job's end
    stopping.cancel()
    again = await h.executor()  # (grace 1 s)
    await again.reconcile()
    view = await h.wait(job, "failed")
    assert view.failure_reason == FailureReason.IDLE and view.attempt == 1
