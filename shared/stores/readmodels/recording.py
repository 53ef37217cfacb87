"""Recording a decision in one stream of a read model (a model's, a volume's): decide on the current view, store
the event with the stream's expected version and the new projection, then publish it.

Optimistic concurrency: a writer that was overtaken decides again on the newer view. An event stored but not
published (a crash in between, no answer from JetStream) is published later by the submit service's outbox
relay (`JobLedger.flush`, which relays every subject the submit role publishes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.bus.outbox import publish_recorded
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData, make_event
from gpuyard.shared.stores.events import ConcurrencyError, EventStore, Projection, StreamKind

MAX_CONFLICT_RETRIES = 8


class Versioned(Protocol):
    @property
    def version(self) -> int: ...


View = TypeVar("View", bound=Versioned)


async def record_in_stream(
    store: EventStore,
    bus: Bus | None,
    source: str,
    stream_id: str,
    kind: StreamKind,
    *,
    read: Callable[[], Awaitable[View | None]],
    apply: Callable[[View | None, CloudEvent, int], View],
    projection_of: Callable[[View], Projection],
    decide: Callable[[View | None], Awaitable[EventData | None]],
) -> tuple[View | None, CloudEvent | None]:
    """Store what `decide(read())` returns (None: nothing, the view as it is) and publish it: (the new view, the
    event). Raises ConcurrencyError when other writers kept winning, and whatever `decide` raises."""
    conflict: ConcurrencyError | None = None
    for _ in range(MAX_CONFLICT_RETRIES):
        view = await read()
        data = await decide(view)
        if data is None:
            return view, None
        event = make_event(data, source=source)
        expected = view.version if view is not None else 0
        new = apply(view, event, expected + 1)
        try:
            await store.append(stream_id, expected, [event], projection_of(new), kind=kind)
        except ConcurrencyError as exc:
            conflict = exc
            continue
        if bus is not None:
            await publish_recorded(bus, event, store, version=new.version)
        return new, event
    assert conflict is not None
    raise conflict
