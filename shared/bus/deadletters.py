"""Dead letters: the events a durable consumer gave up on (its handler failed at the last delivery, or the event
did not parse), kept on `deadletter.<durable>` with where each was going, who gave up and why, for
the admin API to show (`GET /v1/deadletters`)."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from gpuyard.shared.contracts.events.envelope import CONTENT_TYPE
from gpuyard.shared.contracts.events.subjects import DEADLETTER_STREAM

DEADLETTER_PREFIX = "deadletter."


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """An event a consumer gave up on: where it was going, who gave up, why, and the event itself."""

    seq: int
    consumer: str
    original_subject: str
    error: str
    deliveries: int | None
    event: dict | str


async def send_dead_letter(js: JetStreamContext, msg: Msg, durable: str, error: str) -> None:
    """Publish `msg`'s event to `deadletter.<durable>`, with the consumer, its subject and `error` as headers."""
    headers = {
        "Content-Type": (msg.headers or {}).get("Content-Type", CONTENT_TYPE),
        "Gpuyard-Original-Subject": msg.subject,
        "Gpuyard-Consumer": durable,
        "Gpuyard-Error": error[:2000].replace("\r", " ").replace("\n", " "),
    }
    with contextlib.suppress(Exception):
        headers["Gpuyard-Stream-Seq"] = str(msg.metadata.sequence.stream)
        headers["Gpuyard-Deliveries"] = str(msg.metadata.num_delivered)
    await js.publish(DEADLETTER_PREFIX + durable, msg.data, headers=headers)


async def read_dead_letters(js: JetStreamContext, limit: int) -> list[DeadLetter]:
    """The newest dead letters first, at most `limit`, each with the consumer, subject and error."""
    info = await js.stream_info(DEADLETTER_STREAM.name)
    out: list[DeadLetter] = []
    seq = info.state.last_seq
    while seq >= max(info.state.first_seq, 1) and len(out) < limit:
        try:
            msg = await js.get_msg(DEADLETTER_STREAM.name, seq)
        except NotFoundError:  # deleted or expired in between
            seq -= 1
            continue
        headers = msg.headers or {}
        try:
            body: dict | str = json.loads(msg.data or b"")
        except (ValueError, TypeError):
            body = (msg.data or b"").decode(errors="replace")
        deliveries = headers.get("Gpuyard-Deliveries", "")
        out.append(
            DeadLetter(
                seq=seq,
                consumer=headers.get("Gpuyard-Consumer", ""),
                original_subject=headers.get("Gpuyard-Original-Subject", ""),
                error=headers.get("Gpuyard-Error", ""),
                deliveries=int(deliveries) if deliveries.isdigit() else None,
                event=body,
            )
        )
        seq -= 1
    return out
