"""Stand-ins for NATS messages and the bus, to drive the bus's consumer loops (`gpuyard.shared.bus.consumers`, `watches`) without a server (the unit
tests of the bus figures and `benchmarks/bus_overhead.py`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from gpuyard.shared.bus.metrics import BusMetrics


class FakeMsg:
    """A JetStream message as a consumer loop sees it: subject, data, headers, delivery count, acks."""

    def __init__(self, subject: str, data: bytes, *, delivered: int = 1, seq: int = 1):
        self.subject, self.data, self.headers = subject, data, {}
        self.metadata = SimpleNamespace(
            num_delivered=delivered, sequence=SimpleNamespace(stream=seq, consumer=seq)
        )
        self.acked = self.naked = self.termed = 0
        self.ack_seen = asyncio.Event()

    async def ack(self) -> None:
        self.acked += 1
        self.ack_seen.set()

    async def nak(self, delay: float | None = None) -> None:
        self.naked += 1

    async def term(self) -> None:
        self.termed += 1


class FakeBus:
    """What a `PullConsumer` or a `Watch` asks of its bus: the figures, and dead letters (recorded)."""

    def __init__(self, metrics: BusMetrics | None = None):
        self.metrics = metrics if metrics is not None else BusMetrics()
        self.dead: list[tuple[str, str]] = []

    async def dead_letter(self, msg: FakeMsg, durable: str, error: str) -> None:
        self.dead.append((durable, error))
