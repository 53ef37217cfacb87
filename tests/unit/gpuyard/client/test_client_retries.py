"""The client sends one Idempotency-Key per submission and the same key on each retry; it retries what is safe
to retry (no connection, 429/503, and a lost answer only for a request repeating which changes nothing),
honours Retry-After, and reports the reason when it gives up."""

from __future__ import annotations

import httpx
import pytest

from gpuyard import cli
from gpuyard.client import LONGEST_WAIT, Client, ClientError

ACCEPTED = {"job_id": "j1", "name": "n", "tenant": "vision", "state": "queued", "duplicate": False}


def client_with(answers: list, waits: list[float] | None = None) -> tuple[Client, list[httpx.Request]]:
    """A Client whose requests get `answers` in turn: an httpx.Response, or an exception raised."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    client = Client("http://api.test", "token")
    client.http = httpx.Client(base_url=client.server, transport=httpx.MockTransport(handler))
    client.sleep = (waits if waits is not None else []).append
    return client, seen


def test_a_submit_whose_answer_was_lost_is_sent_again_with_the_same_key():
    client, seen = client_with(
        [httpx.RemoteProtocolError("server disconnected"), httpx.Response(202, json=ACCEPTED)]
    )
    assert client.submit({"command": "true"}).job_id == "j1"
    keys = [r.headers["idempotency-key"] for r in seen]
    assert len(keys) == 2 and keys[0] == keys[1] and len(keys[0]) >= 32


def test_each_submission_has_its_own_key():
    client, seen = client_with([httpx.Response(202, json=ACCEPTED), httpx.Response(202, json=ACCEPTED)])
    client.submit({"command": "true"})
    client.submit({"command": "true"})
    assert seen[0].headers["idempotency-key"] != seen[1].headers["idempotency-key"]


def test_429_is_retried_after_what_retry_after_says():
    waits: list[float] = []
    full = httpx.Response(
        429, json={"detail": "tenant 'vision' has 5 jobs queued"}, headers={"Retry-After": "7"}
    )
    client, seen = client_with([full, httpx.Response(202, json=ACCEPTED)], waits)
    told: list[tuple[str, float]] = []
    client.on_retry = lambda why, seconds: told.append((why, seconds))
    assert client.submit({"command": "true"}).job_id == "j1"
    assert waits == [7.0] and told == [("tenant 'vision' has 5 jobs queued (HTTP 429)", 7.0)]
    assert seen[0].headers["idempotency-key"] == seen[1].headers["idempotency-key"]


def test_a_retry_after_too_long_to_wait_is_reported_with_its_reason():
    late = str(int(LONGEST_WAIT) + 1)
    full = httpx.Response(
        429, json={"detail": "tenant 'vision' has 5 jobs queued"}, headers={"Retry-After": late}
    )
    client, seen = client_with([full])
    with pytest.raises(
        ClientError, match=rf"tenant 'vision' has 5 jobs queued \(HTTP 429; retry after {late} s\)"
    ):
        client.submit({"command": "true"})
    assert len(seen) == 1


def test_it_gives_up_after_its_retries_with_backoff():
    waits: list[float] = []
    busy = [httpx.Response(503, json={"detail": "temporarily unavailable"}) for _ in range(5)]
    client, seen = client_with(busy, waits)
    with pytest.raises(ClientError, match=r"temporarily unavailable \(HTTP 503\)"):
        client.jobs()
    assert waits == [0.5, 1.0, 2.0, 4.0] and len(seen) == 5


def test_a_post_without_a_key_is_not_sent_again_when_its_answer_is_lost():
    client, seen = client_with([httpx.ReadTimeout("timed out"), httpx.Response(202, json={})])
    with pytest.raises(ClientError, match="request to http://api.test failed"):
        client.cancel("j1")
    assert len(seen) == 1


def test_a_refused_connection_is_tried_again_then_reported():
    client, seen = client_with([httpx.ConnectError("refused")] * 5)
    with pytest.raises(ClientError, match="cannot reach GPUYARD"):
        client.cancel("j1")  # never reached the server: safe to send again, even without a key
    assert len(seen) == 5


def test_gpuyard_submit_says_why_it_waits(monkeypatch, tmp_path, capsys):
    spec = tmp_path / "job.yaml"
    spec.write_text("command: 'true'\n")
    answers = [
        httpx.Response(
            429, json={"detail": "tenant 'vision' has 5 jobs queued"}, headers={"Retry-After": "3"}
        ),
        httpx.Response(202, json=ACCEPTED),
    ]
    keys: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        keys.append(request.headers["idempotency-key"])
        return answers.pop(0)

    class FakeClient(Client):
        def __init__(self, server=None, token=None, timeout=30):
            super().__init__("http://api.test", "token")
            self.http = httpx.Client(base_url=self.server, transport=httpx.MockTransport(handler))
            self.sleep = lambda seconds: None

    monkeypatch.setattr(cli.common, "Client", FakeClient)
    assert cli.main(["submit", str(spec)]) == 0
    captured = capsys.readouterr()
    assert "tenant 'vision' has 5 jobs queued (HTTP 429); trying again in 3 s" in captured.err
    assert "submitted job j1" in captured.out and len(keys) == 2 and keys[0] == keys[1]
