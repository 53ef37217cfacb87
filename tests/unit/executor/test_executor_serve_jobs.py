"""A serve job's replica is a session of the serving service of its node (docs/architecture.md, "Model
deployments"): the executor never starts one, never adopts one after a restart, and leaves its cancel to the
serving service, while a command placed beside it runs as ever."""

from __future__ import annotations

import asyncio

from shared.events import JobCancelRequested

SERVE = {"serve": {"model": "mnist", "version": 1}, "resources": {"gpus": 0.25}}


async def test_the_executor_never_starts_a_serve_job_but_runs_a_command_beside_it(h, tmp_path):
    executor = await h.executor()
    serve_job = await h.submit(**SERVE)
    await h.place(executor, serve_job)
    command = await h.submit(command=f"echo ran > {tmp_path / 'ran'}")
    await h.place(executor, command)
    await h.wait(command, "succeeded")
    await asyncio.sleep(0.1)
    assert await h.types(serve_job) == ["submitted", "placed"]  # nothing started, nothing recorded
    assert not executor.attempts.get((serve_job, 1))


async def test_a_restarted_executor_leaves_serve_jobs_to_the_serving_service(h):
    first = await h.executor()
    serve_job = await h.submit(**SERVE)
    await h.place(first, serve_job)
    await first.shutdown()
    h.executors.remove(first)
    again = await h.executor()
    await again.reconcile()  # placed here and never started: a command's would be launched now
    await asyncio.sleep(0.1)
    assert await h.types(serve_job) == ["submitted", "placed"]


async def test_the_cancel_of_a_serve_job_is_the_serving_services_to_record(h):
    executor = await h.executor()
    serve_job = await h.submit(**SERVE)
    await h.place(executor, serve_job)
    await h.record(executor, JobCancelRequested(job_id=serve_job, by="ana"))
    await asyncio.sleep(0.1)
    assert await h.types(serve_job) == ["submitted", "placed", "cancel_requested"]
