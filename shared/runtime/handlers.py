"""A service's handlers: a table from an event's model to the function that handles it, one per kind of event.

Every service wires its bus consumers to tables like this one (`main.py`), so that its domain code gets the
typed data of each event (`JobPlaced`, `NodeHeartbeat`…) and the envelope, never a NATS message, and never
tells events apart with a chain of `isinstance`:

    table = HandlerTable({JobPlaced: host.on_placed, (JobCancelRequested, JobPreempted): host.on_stop})
    await service.bus.consume(durable, table.subject_filters(), table, stream=EVENTS_STREAM.name)

An event whose model has no handler is left alone (a consumer's filter may carry more than it needs).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData
from gpuyard.shared.contracts.events.subjects import Subject, subject_filter

Handler = Callable[[Any, CloudEvent], Awaitable[None]]
"""`async def on_placed(data: JobPlaced, event: CloudEvent) -> None`: the event's typed data, then its envelope."""

Models = type[EventData] | tuple[type[EventData], ...]


class HandlerTable:
    """Which handler takes which event model; calling the table with an event (as the bus does, with its
    message, which stays here) runs the handler of the event's model."""

    def __init__(self, handlers: Mapping[Models, Handler]) -> None:
        self.handlers: dict[type[EventData], Handler] = {}
        for models, handler in handlers.items():
            for model in models if isinstance(models, tuple) else (models,):
                if model in self.handlers:
                    raise ValueError(f"two handlers for {model.__name__}")
                self.handlers[model] = handler

    async def __call__(self, event: CloudEvent | None, _msg: object = None) -> None:
        if event is None:  # (the bus passes None only to a watch with decode=False: a table needs the event)
            raise TypeError("a HandlerTable handles decoded events: watch with decode=True")
        handler = self.handlers.get(type(event.data))
        if handler is not None:
            await handler(event.data, event)

    def subjects(self) -> list[Subject]:
        """The subjects of the models handled, in the order of their definition."""
        handled = {model.subject for model in self.handlers}
        return [subject for subject in Subject if subject in handled]

    def subject_filters(self) -> list[str]:
        """The NATS filters of those subjects (a job subject for every tenant)."""
        return [subject_filter(subject) for subject in self.subjects()]
