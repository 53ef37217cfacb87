"""Delivery of every `alert.raised` and `alert.resolved` to each webhook URL (`alert_webhooks`), as
Slack-compatible JSON: `text` (the notification), `blocks` (Block Kit), and the alert's own fields.

Each URL has its own queue and its own sender task, so a failing webhook never holds up another one, nor the
monitor's sampling (enqueuing never waits). A URL's alerts go out in order: a failed POST (no answer within
`webhook_timeout`, or an answer other than 2xx) is tried again after 1 s, then 2, 4… up to
`webhook_max_backoff`, until it is delivered or GIVE_UP_SECONDS after it was queued, when the sender gives it
up with an error in the log. A queue holds at most MAX_QUEUED alerts: past that the oldest is given up (and
logged), so memory stays bounded whatever a webhook does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from gpuyard.shared.contracts.events.alerts import AlertRaised, AlertResolved, AlertSeverity
from gpuyard.shared.contracts.events.envelope import CloudEvent

log = logging.getLogger(__name__)

MAX_QUEUED = 10_000
"""Alerts waiting per URL: past this the oldest is given up."""
GIVE_UP_SECONDS = 24 * 3600.0
"""How long an alert is tried at one URL before it is given up."""
FIRST_BACKOFF = 1.0

ICON = {AlertSeverity.INFO: ":information_source:", AlertSeverity.WARNING: ":warning:"}
ICON_CRITICAL = ":rotating_light:"
ICON_RESOLVED = ":white_check_mark:"


def _firing(data: AlertRaised) -> tuple[str, str, str]:
    icon = ICON.get(data.severity, ICON_CRITICAL)
    where = ", ".join(
        part
        for part in (
            f"node {data.node}" if data.node else "",
            f"GPU {data.gpu_index}" if data.gpu_index is not None else "",
            f"job {data.job_id}" if data.job_id else "",
            f"tenant {data.tenant}" if data.tenant else "",
        )
        if part
    )
    text = f"{icon} [{data.severity.upper()}] {data.kind}: {data.message}"
    return "firing", text, f"alert `{data.alert_id}`" + (f" · {where}" if where else "")


def _resolved(data: AlertResolved) -> tuple[str, str, str]:
    text = f"{ICON_RESOLVED} [RESOLVED] {data.kind}: {data.message or 'cleared'}"
    return "resolved", text, f"alert `{data.alert_id}`"


NOTICES: dict[type, Callable[[Any], tuple[str, str, str]]] = {AlertRaised: _firing, AlertResolved: _resolved}
"""How each alert event is told: (status, in Alertmanager's words; the notification's text; its detail)."""


def payload(event: CloudEvent) -> dict[str, Any]:
    """The JSON POSTed for an alert event: Slack's `text` and `blocks`, then `status` (firing or resolved,
    Alertmanager's words), the event's id and time, and the alert's fields under `alert`."""
    data = event.data
    notice = NOTICES.get(type(data))
    if notice is None:
        raise ValueError(f"{event.type} is not an alert event")
    status, text, detail = notice(data)
    detail += f" · {event.time.isoformat(timespec='seconds')}"
    return {
        "text": text,
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": detail}]},
        ],
        "status": status,
        "event_id": event.id,
        "time": event.time.isoformat(),
        "alert": data.model_dump(mode="json"),
    }


@dataclass(slots=True)
class Pending:
    event_id: str
    body: dict[str, Any]
    queued: float = field(default_factory=time.monotonic)
    tries: int = 0


Post = Callable[[str, dict[str, Any]], Awaitable[None]]
"""POST a body to a URL; raises when it was not delivered."""


class WebhookQueue:
    """One URL's alerts, in order, and the task that delivers them."""

    def __init__(
        self,
        url: str,
        post: Post,
        *,
        max_backoff: float,
        give_up_after: float = GIVE_UP_SECONDS,
        max_queued: int = MAX_QUEUED,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ):
        self.url, self.post = url, post
        self.max_backoff, self.give_up_after, self.max_queued = max_backoff, give_up_after, max_queued
        self.sleep = sleep
        self.queue: deque[Pending] = deque()
        self.ready = asyncio.Event()
        self.delivered = 0
        self.given_up = 0
        self.failures = 0

    def put(self, event_id: str, body: dict[str, Any]) -> None:
        if len(self.queue) >= self.max_queued:
            dropped = self.queue.popleft()
            self.given_up += 1
            log.error(
                "webhook %s: gave up alert event %s: %d alerts waiting for it already",
                self.url,
                dropped.event_id,
                self.max_queued,
            )
        self.queue.append(Pending(event_id, body))
        self.ready.set()

    async def run(self) -> None:
        while True:
            if not self.queue:
                self.ready.clear()
                await self.ready.wait()
                continue
            item = self.queue[0]
            backoff = min(FIRST_BACKOFF, self.max_backoff)
            while True:
                item.tries += 1
                try:
                    await self.post(self.url, item.body)
                except Exception as exc:
                    self.failures += 1
                    waited = time.monotonic() - item.queued
                    if waited >= self.give_up_after:
                        self.given_up += 1
                        log.error(
                            "webhook %s: gave up alert event %s after %d tries over %.0fs: %s",
                            self.url, item.event_id, item.tries, waited, exc,
                        )  # fmt: skip
                        break
                    log.warning(
                        "webhook %s: alert event %s not delivered (try %d), again in %gs: %s",
                        self.url, item.event_id, item.tries, backoff, exc,
                    )  # fmt: skip
                    await self.sleep(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                self.delivered += 1
                break
            if self.queue and self.queue[0] is item:
                self.queue.popleft()


class Webhooks:
    """Every URL's queue and sender. `send(event)` never waits."""

    def __init__(
        self, urls: list[str], *, timeout: float, max_backoff: float, post: Post | None = None, **kw
    ):
        self.client: httpx.AsyncClient | None = None
        if post is None:
            logging.getLogger("httpx").setLevel(
                logging.WARNING
            )  # (a line per POST otherwise; failures are ours)
            self.client = httpx.AsyncClient(timeout=timeout, follow_redirects=False)
            post = self._post
        self.queues = {
            url: WebhookQueue(url, post, max_backoff=max_backoff, **kw) for url in dict.fromkeys(urls)
        }
        self.tasks: list[asyncio.Task] = []

    async def _post(self, url: str, body: dict[str, Any]) -> None:
        assert self.client is not None
        response = await self.client.post(url, json=body)
        if not 200 <= response.status_code < 300:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:200]}")

    def start(self) -> None:
        self.tasks = [asyncio.create_task(q.run(), name=f"webhook:{q.url}") for q in self.queues.values()]

    def send(self, event: CloudEvent) -> None:
        if not self.queues:
            return
        body = payload(event)
        for queue in self.queues.values():
            queue.put(event.id, body)

    async def close(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for queue in self.queues.values():
            if queue.queue:
                log.error("webhook %s: %d alert(s) not delivered at stop", queue.url, len(queue.queue))
        if self.client is not None:
            await self.client.aclose()
