"""What a service's bus consumers do, as Prometheus figures: the events each consumer handled (by subject and
outcome), how long its handler took, and how far each of its JetStream consumers is behind.

`shared.bus` counts, in one place for every service: each `PullConsumer` (a durable) and each `Watch` (an
ordered consumer) gets a `ConsumerFigures` and tells it each event's outcome and handling time. The label
children are resolved once per (subject, outcome), so a message costs a dict lookup and two increments.

Series (`consumer`: the durable's name, or the watch's name):
- `gpuyard_bus_events_handled_total{consumer, subject, outcome}`: `subject` is the event's subject without
  its tenant (`job.placed`); `outcome` one of `OUTCOMES`;
- `gpuyard_bus_event_handling_seconds{consumer}`: the handler's time per event (from its call to its return or
  raise; the wait for an earlier event of the same entity is not counted);
- `gpuyard_bus_consumer_pending_messages{consumer, stream}`, `..._ack_pending_messages`, `..._redelivered_messages`:
  the consumer's `num_pending`, `num_ack_pending` and `num_redelivered` from JetStream's consumer info, read
  every `consumer_lag_interval` seconds (`Bus.consumer_lags`); a consumer whose info could not be read at the
  last refresh has no series until the next one that can.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

OK = "ok"
"""The handler returned: the event is acknowledged."""
REDELIVERED = "redelivered"
"""The handler raised before the consumer's last delivery: the event is handed back for a later delivery."""
DEAD_LETTERED = "dead_lettered"
"""The handler raised at the last delivery, or the event did not parse: it went to `deadletter.<consumer>`."""
SKIPPED = "skipped"
"""Passed over undecoded (the consumer's `wanted` said it had nothing to do with it)."""
FAILED = "failed"
"""A watch's handler raised, or its event did not parse: logged and passed over (a watch never redelivers)."""
OUTCOMES = (OK, REDELIVERED, DEAD_LETTERED, SKIPPED, FAILED)

HANDLING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Seconds: most handlers take well under a millisecond to a few (a store write); a job's start, longer."""


def subject_label(subject: str) -> str:
    """A subject without its tenant: `job.placed.vision` -> `job.placed` (every event subject has two tokens,
    a job event's tenant is a third), so the series do not grow with the tenants."""
    first = subject.find(".")
    second = subject.find(".", first + 1) if first >= 0 else -1
    return subject if second < 0 else subject[:second]


@dataclass(frozen=True, slots=True)
class ConsumerLag:
    """A JetStream consumer's backlog, from its consumer info."""

    consumer: str
    stream: str
    pending: int
    """Events in the stream that match its filter and were not delivered yet."""
    ack_pending: int
    """Delivered and not acknowledged yet (0 for a watch, which does not ack)."""
    redelivered: int
    """Delivered more than once and not acknowledged yet."""


class LagCollector:
    """The latest `ConsumerLag` of each consumer, rendered at each scrape (replaced whole: a scrape from another
    thread sees one refresh or the next, never half of one)."""

    def __init__(self) -> None:
        self.lags: tuple[ConsumerLag, ...] = ()

    def collect(self) -> Iterator[Metric]:
        lags = self.lags
        families = (
            ("pending", "Events the consumer has not been delivered yet (JetStream num_pending)."),
            ("ack_pending", "Events delivered to the consumer and not acknowledged yet (num_ack_pending)."),
            ("redelivered", "Events delivered more than once and not acknowledged yet (num_redelivered)."),
        )
        for field, text in families:
            family = GaugeMetricFamily(
                f"gpuyard_bus_consumer_{field}_messages", text, labels=("consumer", "stream")
            )
            for lag in lags:
                family.add_metric([lag.consumer, lag.stream], getattr(lag, field))
            yield family


class BusMetrics:
    """The bus figures of one service, registered in its registry (`shared.servicemetrics`)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.handled = Counter(
            "gpuyard_bus_events_handled",
            "Events a consumer handled, by subject (without its tenant) and outcome: ok, redelivered, "
            "dead_lettered, skipped (passed over undecoded), failed (a watch's handler raised).",
            ("consumer", "subject", "outcome"),
            registry=self.registry,
        )
        self.handling = Histogram(
            "gpuyard_bus_event_handling_seconds",
            "Seconds a consumer's handler took for one event.",
            ("consumer",),
            buckets=HANDLING_BUCKETS,
            registry=self.registry,
        )
        self.lag = LagCollector()
        self.registry.register(self.lag)

    def consumer(self, name: str) -> ConsumerFigures:
        return ConsumerFigures(self, name)


class ConsumerFigures:
    """One consumer's counters and histogram, each label set resolved at its first use."""

    __slots__ = ("_counts", "_handled", "name", "observe")

    def __init__(self, metrics: BusMetrics, name: str):
        self.name = name
        self._handled = metrics.handled
        self._counts: dict[tuple[str, str], Counter] = {}
        self.observe = metrics.handling.labels(name).observe
        """observe(seconds): one event's handling time."""

    def count(self, subject: str, outcome: str) -> None:
        """One event on `subject` (as delivered, with its tenant) ended with `outcome`."""
        child = self._counts.get((subject, outcome))
        if child is None:
            child = self._handled.labels(self.name, subject_label(subject), outcome)
            self._counts[(subject, outcome)] = child
        child.inc()
