"""The samples the monitor knows: the latest `gpu.sample` of every node, and whoever wants each one as it comes.

Every sample goes through `SampleIngest.ingest`: those of other nodes from the bus (`on_message`, a core NATS
subscription to `gpu.sample`: live, not stored, nothing to acknowledge; its raw messages are decoded here), and
this node's own straight from its sampler (no round trip). /metrics renders `snapshot()`; the alert engine and the usage history read the same
samples in-process through `subscribe(listener)` (each sample once, in arrival order) or `snapshot()`.

Idempotent: a sample of a node that is not newer than the one held (a duplicate, or one overtaken on the way)
changes nothing and is not passed on. A node whose latest sample is older than `stale_after(interval)` is left
out of the snapshot: its GPUs are not shown with figures frozen at its last word.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.nodes import GpuSample

if TYPE_CHECKING:
    from nats.aio.msg import Msg

log = logging.getLogger(__name__)

STALE_INTERVALS = 5
"""A node's sample is stale after this many of its intervals (and at least STALE_MIN_SECONDS)."""
STALE_MIN_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class NodeSample:
    """One node's sample as it arrived."""

    sample: GpuSample
    taken_at: float
    """When the node took it (the event's time, seconds since the epoch)."""
    received_at: float
    """When this monitor got it (its clock)."""

    @property
    def lag(self) -> float:
        return self.received_at - self.taken_at

    def stale(self, now: float) -> bool:
        return now - self.taken_at > max(STALE_MIN_SECONDS, STALE_INTERVALS * self.sample.interval_seconds)


Listener = Callable[[NodeSample], None]


class SampleIngest:
    """The latest sample of every node, and the listeners of each new one."""

    def __init__(self, *, clock: Callable[[], float] = time.time):
        self.clock = clock
        self.latest: dict[str, NodeSample] = {}
        self.listeners: list[Listener] = []
        self.ingested = 0
        """Samples taken in (duplicates and older ones not counted)."""
        self.ignored = 0
        """Samples passed over: not newer than the node's latest, or unreadable."""
        self.last_lag = 0.0

    def subscribe(self, listener: Listener) -> Callable[[], None]:
        """Call `listener(node_sample)` for every new sample, on the monitor's event loop (keep it short:
        hand heavy work to a task). Returns the call that unsubscribes it."""
        self.listeners.append(listener)
        return lambda: self.listeners.remove(listener) if listener in self.listeners else None

    def ingest(self, event: CloudEvent) -> NodeSample | None:
        """Take in one `gpu.sample` event; the NodeSample when it was new, None when passed over."""
        sample = event.data
        if not isinstance(sample, GpuSample):
            self.ignored += 1
            return None
        taken_at = event.time.timestamp()
        held = self.latest.get(sample.node)
        if held is not None and taken_at <= held.taken_at:
            self.ignored += 1
            return None
        new = NodeSample(sample, taken_at, self.clock())
        self.latest[sample.node] = new
        self.ingested += 1
        self.last_lag = new.lag
        for listener in list(self.listeners):
            try:
                listener(new)
            except Exception:  # one reader's bug never stops the others, nor the sampling
                log.exception("a listener of gpu.sample failed on node %s's sample", sample.node)
        return new

    def ingest_json(self, data: bytes) -> NodeSample | None:
        try:
            event = CloudEvent.from_json(data)
        except (ValidationError, ValueError) as exc:
            self.ignored += 1
            log.debug("an unreadable gpu.sample passed over: %s", exc)
            return None
        return self.ingest(event)

    async def on_message(self, msg: Msg) -> None:
        """The callback of the core subscription to `gpu.sample` (`Bus.subscribe`): the raw message, decoded
        here, so that an unreadable sample is counted among those passed over (`ignored`) rather than logged by
        a consumer loop, on the hottest path of the bus (every node's sample, every `sample_interval`)."""
        self.ingest_json(msg.data)

    def snapshot(self) -> list[NodeSample]:
        """Every node's latest sample that is not stale, by node name."""
        now = self.clock()
        return [s for _, s in sorted(list(self.latest.items())) if not s.stale(now)]
