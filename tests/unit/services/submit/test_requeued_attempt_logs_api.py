"""`GET /v1/jobs/{id}/logs` over a job with several attempts: the latest attempt's output by default (as
always), `?attempt=N` another's (a requeued attempt's output stays readable), `?attempt=all` every attempt's in
order, each after a line of the platform's that names it and says how it ended."""

from __future__ import annotations

import asyncio
import threading

import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    JobFailed,
    JobPlaced,
    JobReplicaExited,
    JobRequeued,
    JobStarted,
    JobSucceeded,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.stores.logs import LogKey, split
from tests.unit.services.submit.submitctx import submit_context

VISION = {"Authorization": "Bearer tok-vision"}
NLP = {"Authorization": "Bearer tok-nlp"}
LOST = "the executor of node node-a restarted and lost the job's processes"


@pytest.fixture
def ctx(tmp_path):
    with submit_context(tmp_path) as c:
        yield c


@pytest.fixture
def api(ctx):
    with TestClient(create_app(ctx)) as client:
        yield client


def submit(api, **spec) -> str:
    body = {"name": "train", "command": "python train.py", "resources": {"gpus": 1}, **spec}
    answer = api.post("/v1/jobs", json=body, headers=VISION)
    assert answer.status_code == 202, answer.text
    return answer.json()["job_id"]


def record(ctx, job_id: str, *events) -> None:
    for data in events:
        asyncio.run(ctx.ledger.append(job_id, data))


def ran(job_id: str, attempt: int, replicas: int = 1) -> list:
    """The events of an attempt placed on node-a and started there."""
    placements = [ReplicaPlacement(replica=r, node="node-a") for r in range(replicas)]
    return [
        JobPlaced(job_id=job_id, attempt=attempt, placements=placements),
        JobStarted(job_id=job_id, attempt=attempt, node="node-a", replicas=list(range(replicas))),
    ]


def output(ctx, job_id: str, attempt: int, data: bytes, replica: int = 0, at: int = 0) -> None:
    asyncio.run(ctx.logs.append(split(LogKey(job_id, attempt, replica), at, data)))


def requeued_then_running(api, ctx) -> str:
    """A job whose attempt 1 printed two lines and was lost with its node (requeued), and whose attempt 2
    runs and printed one line, without a newline at its end yet."""
    job_id = submit(api)
    record(ctx, job_id, *ran(job_id, 1))
    output(ctx, job_id, 1, b"epoch 1\nepoch 2\n")
    record(ctx, job_id, JobRequeued(job_id=job_id, attempt=2, reason=RequeueReason.NODE_LOST, message=LOST))
    record(ctx, job_id, *ran(job_id, 2))
    output(ctx, job_id, 2, b"resumed from epoch 2")
    return job_id


def logs(api, job_id: str, **params):
    return api.get(f"/v1/jobs/{job_id}/logs", params=params, headers=VISION)


def test_a_requeued_attempts_output_is_still_read_by_its_number_and_the_latest_is_the_default(api, ctx):
    job_id = requeued_then_running(api, ctx)
    assert logs(api, job_id).text == "resumed from epoch 2"  # the latest attempt's, as before
    assert logs(api, job_id, attempt=2).text == "resumed from epoch 2"
    assert logs(api, job_id, attempt=1).text == "epoch 1\nepoch 2\n"
    assert logs(api, job_id, attempt=1, tail=1).text == "epoch 2\n"


def test_every_attempts_output_comes_in_order_each_after_a_line_that_names_it(api, ctx):
    job_id = requeued_then_running(api, ctx)
    assert logs(api, job_id, attempt="all").text == (
        f"[gpuyard] attempt 1: requeued: node_lost ({LOST})\n"
        "epoch 1\nepoch 2\n"
        "[gpuyard] attempt 2: running\n"
        "resumed from epoch 2"
    )
    assert logs(api, job_id, attempt="all", tail=1).text == (  # the last lines of each
        f"[gpuyard] attempt 1: requeued: node_lost ({LOST})\nepoch 2\n[gpuyard] attempt 2: running\n"
        "resumed from epoch 2"
    )


def test_a_line_an_attempt_left_unfinished_is_ended_before_the_next_attempts_line(api, ctx):
    job_id = submit(api, max_retries=1)
    record(ctx, job_id, *ran(job_id, 1))
    output(ctx, job_id, 1, b"Traceback: boom")  # its last line had no newline
    exited = JobReplicaExited(
        job_id=job_id, attempt=1, node="node-a", replica=0, exit_code=1, reason=FailureReason.EXIT_CODE
    )
    record(ctx, job_id, exited)
    retry = JobRequeued(
        job_id=job_id, attempt=2, reason=RequeueReason.RETRY, message="retry 1/1", exit_code=1
    )
    record(ctx, job_id, retry, *ran(job_id, 2))
    output(ctx, job_id, 2, b"ok\n")
    record(ctx, job_id, JobReplicaExited(job_id=job_id, attempt=2, node="node-a", replica=0, exit_code=0))
    record(ctx, job_id, JobSucceeded(job_id=job_id, attempt=2))
    assert logs(api, job_id, attempt="all").text == (
        "[gpuyard] attempt 1: requeued: retry (retry 1/1)\nTraceback: boom\n"
        "[gpuyard] attempt 2: succeeded\nok\n"
    )


def test_an_attempt_without_output_still_has_its_line(api, ctx):
    job_id = submit(api)
    record(ctx, job_id, *ran(job_id, 1))
    output(ctx, job_id, 1, b"hello\n")
    record(ctx, job_id, JobRequeued(job_id=job_id, attempt=2, reason=RequeueReason.NODE_LOST, message=LOST))
    assert logs(api, job_id).text == ""  # attempt 2 waits in the queue: nothing of its own yet
    assert logs(api, job_id, attempt="all").text == (
        f"[gpuyard] attempt 1: requeued: node_lost ({LOST})\nhello\n[gpuyard] attempt 2: queued\n"
    )


def test_each_replica_has_its_own_attempts(api, ctx):
    job_id = submit(api, replicas=2)
    record(ctx, job_id, *ran(job_id, 1, replicas=2))
    output(ctx, job_id, 1, b"r1 first\n", replica=1)
    record(ctx, job_id, JobRequeued(job_id=job_id, attempt=2, reason=RequeueReason.NODE_LOST, message=LOST))
    record(ctx, job_id, *ran(job_id, 2, replicas=2))
    output(ctx, job_id, 2, b"r1 second\n", replica=1)
    text = logs(api, job_id, attempt="all", replica=1).text
    assert text.splitlines()[1::2] == ["r1 first", "r1 second"]
    assert logs(api, job_id, attempt="all", replica=0).text.count("[gpuyard] attempt") == 2


def test_bad_attempts_are_refused_with_the_reason(api, ctx):
    job_id = requeued_then_running(api, ctx)
    for bad in ("0", "-1", "two", "ALL", "1.5", "", "9" * 20):
        answer = logs(api, job_id, attempt=bad)
        assert answer.status_code == 422 and answer.json()["detail"][0]["loc"] == ["query", "attempt"], bad
    beyond = logs(api, job_id, attempt=3)
    assert beyond.status_code == 404 and beyond.json()["detail"] == f"job {job_id} has 2 attempt(s)"
    ranged = api.get(
        f"/v1/jobs/{job_id}/logs", params={"attempt": "all"}, headers={**VISION, "Range": "bytes=0-3"}
    )
    assert ranged.status_code == 400 and "give ?attempt=N (1 to 2)" in ranged.json()["detail"]
    one = api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 1}, headers={**VISION, "Range": "bytes=0-6"})
    assert one.status_code == 206 and one.text == "epoch 1"  # a Range still reads one attempt's
    assert api.get(f"/v1/jobs/{job_id}/logs", params={"attempt": "all"}, headers=NLP).status_code == 404


def test_following_every_attempt_goes_on_through_a_requeue_until_the_job_ends(api, ctx):
    job_id = submit(api)
    record(ctx, job_id, *ran(job_id, 1))
    output(ctx, job_id, 1, b"first try\n")
    got: list[bytes] = []
    opened = threading.Event()

    def follow() -> None:
        params = {"attempt": "all", "follow": "true"}
        with api.stream("GET", f"/v1/jobs/{job_id}/logs", params=params, headers=VISION) as answer:
            for piece in answer.iter_bytes():
                got.append(piece)
                opened.set()

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert opened.wait(10), "the stream's first line"
    record(ctx, job_id, JobRequeued(job_id=job_id, attempt=2, reason=RequeueReason.NODE_LOST, message=LOST))
    record(ctx, job_id, *ran(job_id, 2))
    output(ctx, job_id, 2, b"second try\n")
    failed = JobFailed(job_id=job_id, attempt=2, reason=FailureReason.EXIT_CODE, message="exited with code 2")
    record(ctx, job_id, failed)
    reader.join(15)
    assert not reader.is_alive(), "the stream to end with the job"
    text = b"".join(got).decode()
    assert text.startswith("[gpuyard] attempt 1: running\nfirst try\n[gpuyard] attempt 2: "), text
    assert text.endswith("\nsecond try\n"), text
