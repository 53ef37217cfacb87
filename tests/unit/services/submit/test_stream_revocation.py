"""A long-lived answer of the API (the live event stream, a job's output followed) lasts only as long as the
credential it was opened with: revoking the token, its expiry or the end of the dashboard session that opened
it ends the stream (services/submit/streamview.py). Served over real HTTP (uvicorn in a thread), as a client
sees it: the stream ends, and connecting again is a 401."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from datetime import datetime, timedelta

import httpx
import pytest

from gpuyard.services.submit.streamview import while_allowed
from gpuyard.shared.auth import sessions, tokens
from gpuyard.shared.stores.logs import LogKey, split
from tests.unit.services.submit.submitctx import served, submit_app, submit_context

ADMIN = {"Authorization": "Bearer tok-admin"}
WITNESS_TIMEOUT = 30.0
"""How long a test waits for the stream to end before it fails (a bound on a hang, not a speed)."""


class Subscription:
    async def unsubscribe(self) -> None:
        pass


class StreamBus:
    """What the event stream asks of the bus: subscriptions (no event is needed to see it end)."""

    def __init__(self) -> None:
        self.subscribed = 0

    async def subscribe(self, subject: str, callback) -> Subscription:
        self.subscribed += 1
        return Subscription()


@pytest.fixture
def ctx(tmp_path):
    with submit_context(tmp_path, session_secret=b"k" * 48, session_lifetime=3600) as c:
        c.bus = StreamBus()
        yield c


@pytest.fixture
def server(ctx):
    with served(submit_app(ctx)) as address:
        yield address


def new_token(server: str, **fields) -> tuple[str, str]:
    created = httpx.post(f"{server}/v1/admin/tokens", json={"tenant": "vision", **fields}, headers=ADMIN)
    assert created.status_code == 201, created.text
    return created.json()["token"], created.json()["id"]


def revoke(server: str, token_id: str) -> None:
    assert httpx.delete(f"{server}/v1/admin/tokens/{token_id}", headers=ADMIN).status_code == 204


def rest_of(lines: Iterator[str]) -> list[str]:
    """What a stream still sends, to its end; the test fails if it has not ended after WITNESS_TIMEOUT (a
    read timeout, or a line, the event stream's keepalive, that comes after it)."""
    deadline = time.monotonic() + WITNESS_TIMEOUT
    rest = []
    for line in lines:
        assert time.monotonic() < deadline, f"the stream has not ended: {rest[-5:]}"
        rest.append(line)
    return rest


def test_revoking_a_token_ends_the_event_stream_it_opened(server):
    token, token_id = new_token(server)
    bearer = {"Authorization": f"Bearer {token}"}
    with httpx.stream("GET", f"{server}/v1/events/stream", headers=bearer, timeout=WITNESS_TIMEOUT) as stream:
        assert stream.status_code == 200
        assert stream.headers["x-content-type-options"] == "nosniff"
        lines = stream.iter_lines()
        assert next(lines) == ": connected"
        revoke(server, token_id)
        rest = rest_of(lines)
    assert ": access ended: unknown or revoked token" in rest
    again = httpx.get(f"{server}/v1/events/stream", headers=bearer)
    assert again.status_code == 401


def test_revoking_a_token_ends_the_output_it_follows(server, ctx):
    token, token_id = new_token(server)
    bearer = {"Authorization": f"Bearer {token}"}
    job = httpx.post(f"{server}/v1/jobs", json={"command": "train"}, headers=bearer).json()["job_id"]
    asyncio.run(ctx.logs.append(split(LogKey(job, 1, 0), 0, b"epoch 1\n")))
    follow = f"{server}/v1/jobs/{job}/logs"
    with httpx.stream(
        "GET", follow, params={"follow": "true"}, headers=bearer, timeout=WITNESS_TIMEOUT
    ) as stream:
        assert stream.status_code == 200  # (the job is queued: its output would be followed until it ends)
        assert stream.headers["x-content-type-options"] == "nosniff"
        assert stream.headers["content-type"] == "text/plain; charset=utf-8"
        lines = stream.iter_lines()
        assert next(lines) == "epoch 1"
        revoke(server, token_id)
        assert rest_of(lines) == []
    assert httpx.get(follow, params={"follow": "true"}, headers=bearer).status_code == 401


def clock_ahead_by(ahead: list[timedelta]) -> type[datetime]:
    """A `datetime` whose now() is ahead of the real one by `ahead[0]` (the token module's clock)."""

    class Clock(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime.now(tz) + ahead[0]

    return Clock


def test_a_token_that_expires_mid_stream_ends_it(server, monkeypatch):
    token, _ = new_token(server, expires_in=3600)
    bearer = {"Authorization": f"Bearer {token}"}
    ahead = [timedelta(0)]
    monkeypatch.setattr(tokens, "datetime", clock_ahead_by(ahead))
    with httpx.stream("GET", f"{server}/v1/events/stream", headers=bearer, timeout=WITNESS_TIMEOUT) as stream:
        lines = stream.iter_lines()
        assert next(lines) == ": connected"
        ahead[0] = timedelta(hours=2)  # past the token's expiry
        rest = rest_of(lines)
    assert any(line.startswith(": access ended: token ") and "expired at" in line for line in rest), rest


def test_a_dashboard_sessions_stream_ends_when_its_token_is_revoked(server):
    token, token_id = new_token(server)
    with httpx.Client(base_url=server, timeout=WITNESS_TIMEOUT) as browser:
        login = browser.post("/login", data={"token": token})
        assert login.status_code == 303 and sessions.COOKIE in browser.cookies
        with browser.stream("GET", "/v1/events/stream") as stream:
            lines = stream.iter_lines()
            assert next(lines) == ": connected"
            revoke(server, token_id)
            assert ": access ended: unknown or revoked token" in rest_of(lines)
        assert browser.get("/v1/events/stream").status_code == 401


class Flag:
    """An `Access` whose credential is refused once `refuse` is set."""

    def __init__(self) -> None:
        self.why: str | None = None
        self.checks = asyncio.Event()

    async def refused(self) -> str | None:
        self.checks.set()
        return self.why


def test_a_stream_that_sends_nothing_still_ends_once_its_credential_is_refused_and_is_closed():
    closed = asyncio.Event()

    async def silent():
        try:
            await asyncio.Event().wait()  # never sends a thing
            yield b""
        finally:
            closed.set()

    async def run() -> list[bytes]:
        flag = Flag()
        stream = while_allowed(silent(), flag, farewell=lambda why: f"ended: {why}".encode(), every=0.01)
        sent = asyncio.ensure_future(anext(stream))
        await flag.checks.wait()  # it is checking while nothing comes
        flag.why = "unknown or revoked token"
        first = await asyncio.wait_for(sent, WITNESS_TIMEOUT)
        rest = [chunk async for chunk in stream]
        await asyncio.wait_for(closed.wait(), WITNESS_TIMEOUT)  # the source was closed with it
        return [first, *rest]

    assert asyncio.run(run()) == [b"ended: unknown or revoked token"]


def test_a_stream_sends_nothing_more_once_its_credential_is_refused():
    async def chatty():
        n = 0
        while True:
            n += 1
            yield str(n).encode()

    async def run() -> list[bytes]:
        flag = Flag()
        got = []
        async for chunk in while_allowed(chatty(), flag):
            got.append(chunk)
            if chunk == b"3":
                flag.why = "revoked"
        return got

    assert asyncio.run(run()) == [b"1", b"2", b"3"]
