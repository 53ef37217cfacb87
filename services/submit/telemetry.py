"""The latest heartbeat of every node and service, kept from the bus for `GET /v1/nodes` and `/v1/services`.

A service instance is named by its host and pid, so every restart is a new one: an instance silent for
FORGET_SERVICE_AFTER is forgotten (nodes keep their names and stay listed, lost or not)."""

from __future__ import annotations

import contextlib
import time

from shared.bus import Bus
from shared.events import CloudEvent, NodeHeartbeat, NodeLost, ServiceHeartbeat, Subject

FORGET_SERVICE_AFTER = 86400.0


class Telemetry:
    def __init__(self) -> None:
        self.nodes: dict[str, tuple[float, NodeHeartbeat]] = {}
        self.services: dict[str, tuple[float, ServiceHeartbeat]] = {}
        self.lost: set[str] = set()  # declared lost by the scheduler, and silent since
        self._pruned = 0.0

    def observe(self, event: CloudEvent) -> None:
        if isinstance(event.data, NodeHeartbeat):
            self.nodes[event.data.node] = (time.time(), event.data)
            self.lost.discard(event.data.node)
        elif isinstance(event.data, NodeLost):
            self.lost.add(event.data.node)
        elif isinstance(event.data, ServiceHeartbeat):
            now = time.time()
            self.services[event.data.instance] = (now, event.data)
            if now - self._pruned > 60:
                self._pruned = now
                for instance, (seen, _) in list(self.services.items()):
                    if now - seen > FORGET_SERVICE_AFTER:
                        del self.services[instance]

    def live_nodes(self, now: float | None = None) -> list[NodeHeartbeat]:
        """The nodes that announced themselves lately (within three of their heartbeat intervals) and were not
        declared lost since: the cluster a new job could run on."""
        now = time.time() if now is None else now
        return [
            hb
            for seen, hb in self.nodes.values()
            if hb.node not in self.lost and now - seen <= 3 * hb.interval_seconds + 5
        ]

    async def follow(self, bus: Bus) -> None:
        async def on_msg(msg) -> None:
            with contextlib.suppress(ValueError):
                self.observe(CloudEvent.from_json(msg.data))

        await bus.subscribe(Subject.NODE_HEARTBEAT.value, on_msg)
        await bus.subscribe(Subject.SERVICE_HEARTBEAT.value, on_msg)
        await bus.subscribe(Subject.NODE_LOST.value, on_msg)
