"""A 503 (the store's disk full, its lock held by another writer, the bus away) is retried after what its
Retry-After says, within bounds, for a request that repeating changes nothing: a GET, a submission (its
Idempotency-Key), a request marked idempotent. Any other request is answered with the reason and the wait."""

from __future__ import annotations

import httpx
import pytest

from gpuyard.client import LONGEST_WAIT, RETRIES, Client, ClientError

ACCEPTED = {"job_id": "j1", "name": "n", "tenant": "vision", "state": "queued", "duplicate": False}
FULL = {"detail": "temporarily unavailable: the event store cannot write: its disk is full"}


def full(seconds: str = "30") -> httpx.Response:
    return httpx.Response(503, json=FULL, headers={"Retry-After": seconds})


def client_with(answers: list) -> tuple[Client, list[httpx.Request], list[float]]:
    seen: list[httpx.Request] = []
    waits: list[float] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return answers.pop(0)

    client = Client("http://api.test", "token")
    client.http = httpx.Client(base_url=client.server, transport=httpx.MockTransport(handler))
    client.sleep = waits.append
    return client, seen, waits


def test_a_submission_answered_503_is_sent_again_after_retry_after_with_its_key():
    client, seen, waits = client_with([full("30"), full("12"), httpx.Response(202, json=ACCEPTED)])
    told: list[tuple[str, float]] = []
    client.on_retry = lambda why, seconds: told.append((why, seconds))
    assert client.submit({"command": "true"}).job_id == "j1"
    assert waits == [30.0, 12.0]
    assert len({r.headers["idempotency-key"] for r in seen}) == 1 and len(seen) == 3
    assert told[0] == (f"{FULL['detail']} (HTTP 503)", 30.0)


def test_a_get_answered_503_is_retried_at_most_its_retries():
    client, seen, waits = client_with([full("1") for _ in range(RETRIES + 1)])
    with pytest.raises(ClientError, match=r"its disk is full \(HTTP 503; retry after 1 s\)"):
        client.jobs()
    assert len(seen) == RETRIES + 1 and waits == [1.0] * RETRIES


def test_a_retry_after_longer_than_the_client_waits_is_reported_not_waited_for():
    client, seen, waits = client_with([full(str(int(LONGEST_WAIT) + 1))])
    with pytest.raises(ClientError, match=rf"HTTP 503; retry after {int(LONGEST_WAIT) + 1} s"):
        client.submit({"command": "true"})
    assert len(seen) == 1 and waits == []


def test_a_request_that_repeating_could_change_is_not_sent_again_after_a_503():
    client, seen, waits = client_with([full("1"), httpx.Response(200, json={})])
    with pytest.raises(ClientError, match=r"its disk is full \(HTTP 503; retry after 1 s\)"):
        client.cancel("j1")  # a POST without an Idempotency-Key
    assert len(seen) == 1 and waits == []


def test_a_request_marked_idempotent_is_sent_again_after_a_503():
    client, seen, waits = client_with([full("3"), httpx.Response(200, json={"ok": True})])
    assert client.request("POST", "/v1/models", content=b"onnx", idempotent=True) == {"ok": True}
    assert len(seen) == 2 and waits == [3.0]


def test_a_503_without_retry_after_backs_off_and_a_429_is_retried_whatever_the_request():
    client, seen, waits = client_with(
        [
            httpx.Response(503, json={"detail": "bus away"}),
            httpx.Response(200, json=[]),
            httpx.Response(429, json={"detail": "queue full"}, headers={"Retry-After": "4"}),
            httpx.Response(200, json={"job_id": "j1"}),
        ]
    )
    assert client.request("GET", "/v1/nodes") == []
    assert client.request("POST", "/v1/jobs/j1/cancel") == {"job_id": "j1"}  # 429: refused before anything
    assert waits == [0.5, 4.0] and len(seen) == 4
