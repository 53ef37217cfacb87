"""`gpuyard logs` over a job with a requeued attempt, against the real submit API: `--attempt N` and
`--attempt all` reach every attempt's output, and a latest attempt with nothing yet says where the earlier
one's output is."""

from __future__ import annotations

import asyncio

import pytest
from fastapi.testclient import TestClient

from gpuyard import cli
from gpuyard.client import Client
from gpuyard.services.submit.app import create_app
from gpuyard.shared.contracts.events.jobs import (
    JobPlaced,
    JobRequeued,
    JobStarted,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.stores.logs import LogKey, split
from tests.unit.services.submit.submitctx import submit_context

VISION = {"Authorization": "Bearer tok-vision"}
LOST = "the executor of node node-a restarted and lost the job's processes"


@pytest.fixture
def ctx(tmp_path):
    with submit_context(tmp_path) as c:
        yield c


@pytest.fixture
def api(ctx, monkeypatch):
    """The CLI's client talks to the submit app in process, as tenant vision."""
    with TestClient(create_app(ctx), base_url="http://api.test") as app:

        class InProcess(Client):
            def __init__(self, server=None, token=None, timeout=30, **_):
                super().__init__("http://api.test", "tok-vision", retries=0)
                app.headers.update(self.http.headers)
                self.http = app

        monkeypatch.setattr(cli.common, "Client", InProcess)
        yield app


def requeued(api, ctx) -> str:
    """A job whose attempt 1 printed a line and was requeued as lost; attempt 2 waits in the queue."""
    body = {"name": "train", "command": "python train.py", "resources": {"gpus": 1}}
    job_id = api.post("/v1/jobs", json=body, headers=VISION).json()["job_id"]
    placements = [ReplicaPlacement(replica=0, node="node-a")]
    for data in (
        JobPlaced(job_id=job_id, attempt=1, placements=placements),
        JobStarted(job_id=job_id, attempt=1, node="node-a", replicas=[0]),
        JobRequeued(job_id=job_id, attempt=2, reason=RequeueReason.NODE_LOST, message=LOST),
    ):
        asyncio.run(ctx.ledger.append(job_id, data))
    asyncio.run(ctx.logs.append(split(LogKey(job_id, 1, 0), 0, b"epoch 1\n")))
    return job_id


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_logs_reach_a_requeued_attempts_output_by_number_or_all(api, ctx, capsys):
    job_id = requeued(api, ctx)
    assert run(capsys, "logs", job_id, "--attempt", "1") == (0, "epoch 1\n", "")
    code, out, _ = run(capsys, "logs", job_id, "--attempt", "all")
    assert code == 0 and out == (
        f"[gpuyard] attempt 1: requeued: node_lost ({LOST})\nepoch 1\n[gpuyard] attempt 2: queued\n"
    )


def test_the_latest_attempt_without_output_says_where_the_earlier_ones_is(api, ctx, capsys):
    job_id = requeued(api, ctx)
    code, out, err = run(capsys, "logs", job_id)
    assert code == 0 and out == ""
    assert " ".join(err.split()) == (
        f"no output: attempt 2 of job {job_id} has not started yet (queued); attempt 1's output: gpuyard logs "
        f"{job_id} --attempt 1 (every attempt's: --attempt all)"
    )


@pytest.mark.parametrize("bad", ["0", "two", "-1", "ALL"])
def test_an_attempt_that_is_neither_a_number_nor_all_is_one_line(api, capsys, bad):
    with pytest.raises(SystemExit) as refused:
        cli.main(["logs", "abcd1234", "--attempt", bad])
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert f"argument --attempt: {bad!r} is not an attempt: give its number (1, 2…) or all" in err
