"""Positive witnesses for the tests' "it changed nothing" checks: instead of sleeping and then looking, a test
waits for proof that the event it sent has been handled, and only then checks that nothing came of it.

A durable consumer acknowledges an event only once its handler is done with it (`gpuyard.shared.bus.consumers`: ack after the
effect), and JetStream never delivers an acknowledged event again. So once a consumer's ack floor (the stream
sequence up to which it has acknowledged everything) has reached an event's sequence, whatever that consumer
was going to do about the event is done."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.subjects import EVENTS_STREAM

ACK_WITNESS_SECONDS = 60.0
"""A generous bound on the wait: a slow machine only takes longer to get there."""


async def acknowledged(
    bus: Bus,
    durables: Sequence[str],
    seq: int,
    *,
    stream: str = EVENTS_STREAM.name,
    within: float = ACK_WITNESS_SECONDS,
) -> None:
    """Return once every consumer of `durables` has acknowledged the events of `stream` up to and including
    the one at sequence `seq` (handled, or passed over as not its business). `bus` must be a user that may read
    `stream`'s consumers (a role that follows it)."""
    deadline = time.monotonic() + within
    floors: dict[str, int] = {}
    while True:
        for durable in durables:
            info = await bus.js.consumer_info(stream, durable)
            floors[durable] = info.ack_floor.stream_seq if info.ack_floor else 0
        if all(floor >= seq for floor in floors.values()):
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {within:g}s waiting for {', '.join(durables)} to acknowledge stream "
                f"sequence {seq} of {stream}: ack floors {floors}"
            )
        await asyncio.sleep(0.05)
