"""What the scheduler reads of its service once the service has started: its bus, event store and job ledger
(None before `Service.start`). Each is checked where it is first read: a read before the start is a mistake."""

from __future__ import annotations

from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.stores.events import EventStore
from gpuyard.shared.stores.ledger import JobLedger


def bus_of(service: Service) -> Bus:
    if service.bus is None:
        raise RuntimeError("the scheduler uses the bus once its service has started")
    return service.bus


def store_of(service: Service) -> EventStore:
    if service.store is None:
        raise RuntimeError("the scheduler reads the event store once its service has started")
    return service.store


def ledger_of(service: Service) -> JobLedger:
    if service.ledger is None:
        raise RuntimeError("the scheduler records through the job ledger once its service has started")
    return service.ledger
