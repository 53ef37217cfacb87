"""A requeued attempt's output reaches the API as the later attempt's does. Here attempt 1's executor dies
before its output reached the log store (only the node's file holds it) and its reaper is killed too: the next
executor finds the attempt lost and requeues it (`node_lost`), and ships what the node's file holds of it on
the way; attempt 2 then runs. `GET /v1/jobs/{id}/logs` gives each attempt's output by its number, and every
attempt's with `?attempt=all`."""

from __future__ import annotations

import json
import os
import signal

import httpx
import pytest

from gpuyard.services.executor.pidfiles import pid_file
from gpuyard.services.executor.processes import process_start_time
from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.context import SubmitContext
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.runtime.paths import log_path
from gpuyard.shared.stores.logs import LogKey
from tests.unit.services.executor.harness import Harness
from tests.unit.services.submit.submitctx import TOKENS

TENANT = {"Authorization": "Bearer tok-vision"}


@pytest.fixture
async def h(tmp_path):
    harness = await Harness(tmp_path).open()
    yield harness
    await harness.close()


def crash(ex) -> None:
    """The executor dies without stopping anything (its reaper goes on): forget its replicas as a crash would."""
    ex.backend.replicas.clear()
    for task in list(ex.backend.watchers):
        task.cancel()
    ex.backend.reaper.close()
    ex.attempts._held.clear()


def shipped(h: Harness, job: str, attempt: int):
    """A check for `Harness.wait_for`: replica 0 of the attempt has output in the log store."""

    async def check() -> bool:
        return await h.logs.extent(LogKey(job, attempt, 0)) is not None

    return check


def api_of(h: Harness, tmp_path) -> httpx.AsyncClient:
    """The submit API over the harness's stores, as tenant vision."""
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tokens": TOKENS}))
    ctx = SubmitContext(store=h.store, ledger=h.ledger, tokens=Tokens(tokens), logs=h.logs)
    transport = httpx.ASGITransport(app=create_app(ctx))
    return httpx.AsyncClient(transport=transport, base_url="http://submit", headers=TENANT)


async def test_the_output_of_an_attempt_requeued_as_lost_reaches_the_api_beside_the_next_ones(h, tmp_path):
    go = tmp_path / "go"
    job = await h.submit(
        tenant="vision",
        command=f"echo attempt $GPUYARD_ATTEMPT says hello; while [ ! -e {go} ]; do sleep 0.05; done; echo bye",
    )
    logs, h.logs = h.logs, None  # attempt 1's executor ships nothing before it dies: the node's file has it
    first = await h.executor()
    h.logs = logs
    await h.place(first, job)
    await h.wait(job, "running")
    node_file = log_path(h.data_dir, job, 1, 0)
    await h.wait_for(
        lambda: node_file.exists() and "says hello" in node_file.read_text(), what="its first line"
    )
    record = json.loads(pid_file(h.data_dir, job, 1, 0).read_text())
    crash(first)
    os.kill(record["reaper"], signal.SIGKILL)  # how the replica ends can never be known: the attempt is lost
    await h.wait_for(lambda: process_start_time(record["reaper"]) is None, 5, "the reaper's end")

    again = await h.executor()
    await again.reconcile()
    view = await h.wait(job, "queued")
    assert view.attempt == 2 and view.attempts[0].summary == "requeued: node_lost"
    await h.wait_for(shipped(h, job, 1), 10, "attempt 1's output in the log store")

    go.touch()
    await h.place(again, job, attempt=2)
    await h.wait(job, "succeeded")
    async with api_of(h, tmp_path) as api:
        first_output = (await api.get(f"/v1/jobs/{job}/logs", params={"attempt": 1})).text
        assert first_output == "attempt 1 says hello\n"
        await h.wait_for(shipped(h, job, 2), 10, "attempt 2's output in the log store")
        latest = await api.get(f"/v1/jobs/{job}/logs")
        assert latest.text == "attempt 2 says hello\nbye\n"
        every = (await api.get(f"/v1/jobs/{job}/logs", params={"attempt": "all"})).text
    lines = every.splitlines()
    assert lines[0].startswith("[gpuyard] attempt 1: requeued: node_lost (")
    assert lines[1:] == [
        "attempt 1 says hello",
        "[gpuyard] attempt 2: succeeded",
        "attempt 2 says hello",
        "bye",
    ]
