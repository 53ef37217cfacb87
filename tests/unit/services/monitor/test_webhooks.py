"""Webhook delivery against a real local HTTP receiver: Slack-compatible JSON, retries with backoff, a failing
URL that holds up no other, and alerts given up only after the bound (logged), in bounded memory."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpuyard.services.monitor.webhooks import Webhooks, payload
from gpuyard.shared.contracts.events.alerts import AlertRaised, AlertResolved
from gpuyard.shared.contracts.events.envelope import make_event


class Receiver:
    """An HTTP server on a free port that answers 500 to its first `failures` POSTs, then 200 'ok'."""

    def __init__(self, failures: int = 0):
        self.failures = failures
        self.tries = 0
        self.bodies: list[dict] = []
        self.got = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.tries += 1
                fail = receiver.tries <= receiver.failures
                if not fail:
                    receiver.bodies.append(body)
                    receiver.got.set()
                self.send_response(500 if fail else 200)
                self.end_headers()
                self.wfile.write(b"boom" if fail else b"ok")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receivers():
    made: list[Receiver] = []

    def make(failures: int = 0) -> Receiver:
        made.append(Receiver(failures))
        return made[-1]

    yield make
    for r in made:
        r.close()


def raised(n: int = 0):
    return make_event(
        AlertRaised(
            alert_id=f"gpu_temperature/node-1/{n}", kind="gpu_temperature", severity="critical",
            message=f"GPU {n} on node-1 at 91 °C", node="node-1", gpu_index=n, value=91, threshold=85,
        ),
        source="/test",
    )  # fmt: skip


async def until(check, within: float = 10):
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def test_the_payload_is_slack_compatible_with_the_alerts_fields():
    event = raised(3)
    body = payload(event)
    assert body["text"].startswith(":rotating_light: [CRITICAL] gpu_temperature: GPU 3 on node-1 at 91 °C")
    assert body["blocks"][0] == {"type": "section", "text": {"type": "mrkdwn", "text": body["text"]}}
    assert "gpu_temperature/node-1/3" in body["blocks"][1]["elements"][0]["text"]
    assert body["status"] == "firing" and body["event_id"] == event.id
    assert body["alert"]["value"] == 91 and body["alert"]["severity"] == "critical"
    done = payload(make_event(AlertResolved(alert_id="a/b", kind="gpu_idle", message="busy"), source="/t"))
    assert done["status"] == "resolved" and done["text"] == ":white_check_mark: [RESOLVED] gpu_idle: busy"


def test_a_webhook_that_fails_its_first_tries_gets_every_alert_in_order_and_blocks_no_other(receivers):
    failing, healthy = receivers(failures=10**6), receivers()

    async def scenario():
        hooks = Webhooks([failing.url, healthy.url], timeout=2, max_backoff=0.02)
        hooks.start()
        events = [raised(n) for n in range(3)]
        for e in events:
            hooks.send(e)  # never waits
        await until(
            lambda: len(healthy.bodies) == 3 and failing.tries >= 3
        )  # delivered while the other fails
        assert failing.bodies == []
        failing.failures = failing.tries  # the receiver is back
        queue = hooks.queues[failing.url]
        await until(lambda: queue.delivered == 3)
        assert queue.failures == failing.failures and queue.delivered == 3 and queue.given_up == 0
        assert not queue.queue
        await hooks.close()
        return [e.id for e in events]

    ids = asyncio.run(scenario())
    assert [b["event_id"] for b in failing.bodies] == ids == [b["event_id"] for b in healthy.bodies]
    assert failing.tries == failing.failures + 3


def test_the_wait_between_tries_doubles_up_to_the_maximum():
    waits: list[float] = []
    tries = 0

    async def post(url, body):
        nonlocal tries
        tries += 1
        if tries <= 6:
            raise ConnectionError("refused")

    async def sleep(seconds):
        waits.append(seconds)

    async def scenario():
        hooks = Webhooks(["http://x"], timeout=1, max_backoff=5, post=post, sleep=sleep)
        hooks.start()
        hooks.send(raised())
        await until(lambda: hooks.queues["http://x"].delivered == 1)
        await hooks.close()

    asyncio.run(scenario())
    assert waits == [1, 2, 4, 5, 5, 5]


def test_an_alert_is_given_up_only_after_the_bound_and_that_is_logged(caplog):
    async def post(url, body):
        raise ConnectionError("refused")

    async def scenario():
        hooks = Webhooks(["http://down"], timeout=1, max_backoff=0.01, post=post, give_up_after=0.2)
        hooks.start()
        hooks.send(raised(1))
        queue = hooks.queues["http://down"]
        await until(lambda: queue.given_up == 1)
        assert queue.failures > 3 and not queue.queue
        await hooks.close()

    with caplog.at_level(logging.ERROR):
        asyncio.run(scenario())
    assert any("gave up alert event" in r.message and "refused" in r.message for r in caplog.records)


def test_a_queue_holds_at_most_its_bound_and_says_which_alert_it_gave_up(caplog):
    blocked = asyncio.Event

    async def scenario():
        gate = blocked()

        async def post(url, body):
            await gate.wait()

        hooks = Webhooks(["http://slow"], timeout=1, max_backoff=1, post=post, max_queued=3)
        hooks.start()
        events = [raised(n) for n in range(5)]
        for e in events:
            hooks.send(e)
        queue = hooks.queues["http://slow"]
        assert len(queue.queue) == 3 and queue.given_up == 2
        gate.set()
        await until(lambda: not queue.queue)
        await hooks.close()
        return events

    with caplog.at_level(logging.ERROR):
        events = asyncio.run(scenario())
    given_up = [r.message for r in caplog.records if "gave up" in r.message]
    assert len(given_up) == 2 and events[0].id in given_up[0]
