"""Publishing an event the event store already holds (the outbox): published, then marked published in the
store; what could not be published stays unmarked, and the outbox relay (`gpuyard.shared.stores.ledger`)
publishes it later."""

from __future__ import annotations

import logging

from gpuyard.shared.contracts.events.envelope import CloudEvent

log = logging.getLogger(__name__)


async def publish_recorded(bus, event: CloudEvent, store, *, version: int | None = None) -> bool:
    """Publish an event the event store `store` already holds (None: none does), and mark it published there.
    A failure is said and left to the outbox relay, which publishes what stays unmarked. True once published."""
    try:
        await (bus.publish(event) if version is None else bus.publish(event, version=version))
        if store is not None:
            await store.mark_published([event.id])
    except Exception as exc:
        log.warning("publish of %s %s failed, left to the outbox relay: %s", event.type, event.id, exc)
        return False
    return True
