"""A serve job's replica is a session of the serving service of its node (docs/architecture.md, "Model
deployments"): the executor never starts one, never adopts one after a restart, and leaves its cancel to the
serving service, while a command placed beside it runs as ever."""

from __future__ import annotations

from gpuyard.shared.contracts.events.jobs import JobCancelRequested, JobPlaced, ReplicaPlacement

from .witnesses import job_sessions

SERVE = {"serve": {"model": "mnist", "version": 1}, "resources": {"gpus": 0.25}}


async def test_the_executor_never_starts_a_serve_job_but_runs_a_command_beside_it(h, tmp_path):
    executor = await h.executor()
    serve_job = await h.submit(**SERVE)
    await h.place(executor, serve_job)
    command = await h.submit(command=f"echo ran > {tmp_path / 'ran'}")
    await h.place(executor, command)  # placed after the serve job: its run is the witness
    await h.wait(command, "succeeded")
    assert await h.types(serve_job) == ["submitted", "placed"]  # nothing started, nothing recorded
    assert not executor.attempts.get((serve_job, 1)) and job_sessions(serve_job) == set()
    assert not (h.data_dir / "jobs" / serve_job).exists()


async def test_a_restarted_executor_leaves_serve_jobs_to_the_serving_service(h):
    first = await h.executor()
    serve_job = await h.submit(**SERVE)
    await h.place(first, serve_job)
    await first.shutdown()
    h.executors.remove(first)
    command = await h.submit(command="true")  # placed while no executor ran: the restart launches it
    await h.ledger.append(
        command, JobPlaced(job_id=command, attempt=1, placements=[ReplicaPlacement(replica=0, node="node-a")])
    )
    again = await h.executor()
    await again.reconcile()  # both placed here and never started
    await h.wait(command, "succeeded")  # the witness: the same reconciliation launched the command's
    assert await h.types(serve_job) == ["submitted", "placed"]
    assert not again.attempts.get((serve_job, 1)) and job_sessions(serve_job) == set()


async def test_the_cancel_of_a_serve_job_is_the_serving_services_to_record(h):
    executor = await h.executor()
    serve_job = await h.submit(**SERVE)
    await h.place(executor, serve_job)
    command = await h.submit(command="sleep 60")
    await h.place(executor, command)
    await h.wait(command, "running")
    await h.record(executor, JobCancelRequested(job_id=serve_job, by="ana"))
    # the witness: a cancel delivered after it, of the command running beside it, is carried out
    await h.record(executor, JobCancelRequested(job_id=command, by="ana"))
    assert (await h.wait(command, "cancelled")).message == "cancelled while running"
    assert await h.types(serve_job) == ["submitted", "placed", "cancel_requested"]
