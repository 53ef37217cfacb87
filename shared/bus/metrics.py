"""What a service's bus consumers do, as Prometheus figures: the events each consumer handled (by subject and
outcome), how long its handler took, and how far each of its JetStream consumers is behind.

The bus's consumer loops count, in one place for every service: each `PullConsumer` (a durable,
`gpuyard.shared.bus.consumers`) and each `Watch` (an ordered consumer, `gpuyard.shared.bus.watches`) gets
the `ConsumerFigures` of its name and tells it each event's outcome and handling time. Those are plain
numbers the event loop adds to (a dict entry, a histogram bucket: a fraction of a microsecond;
prometheus-client's own Counter and Histogram, with their locks, cost several times more), rendered at each
scrape by `BusMetrics.collect` (the registry's collector, as the monitor's are), from whatever thread scrapes:
it reads copies, each taken whole.

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

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

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


class BusMetrics:
    """The bus figures of one service, a collector of its registry (`gpuyard.shared.runtime.servicemetrics`)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        self.consumers: dict[str, ConsumerFigures] = {}
        self.lags: tuple[ConsumerLag, ...] = ()
        """The latest backlog of each consumer, replaced whole at each refresh."""
        self.registry.register(self)

    def consumer(self, name: str) -> ConsumerFigures:
        """The figures of the consumer `name` (the same ones for a consumer opened again under its name)."""
        figures = self.consumers.get(name)
        if figures is None:
            figures = self.consumers[name] = ConsumerFigures(name)
        return figures

    def describe(self) -> list[Metric]:
        return []  # (its series come and go with the consumers: nothing to check at registration)

    def collect(self) -> Iterator[Metric]:
        consumers = list(self.consumers.values())
        handled = CounterMetricFamily(
            "gpuyard_bus_events_handled",
            "Events a consumer handled, by subject (without its tenant) and outcome: ok, redelivered, "
            "dead_lettered, skipped (passed over undecoded), failed (a watch's handler raised).",
            labels=("consumer", "subject", "outcome"),
        )
        handling = HistogramMetricFamily(
            "gpuyard_bus_event_handling_seconds",
            "Seconds a consumer's handler took for one event.",
            labels=("consumer",),
        )
        for figures in consumers:
            totals: dict[tuple[str, str], int] = {}
            for (subject, outcome), n in figures.counts.copy().items():
                key = (subject_label(subject), outcome)
                totals[key] = totals.get(key, 0) + n
            for (subject, outcome), n in sorted(totals.items()):
                handled.add_metric([figures.name, subject, outcome], n)
            buckets, total = figures.buckets.copy(), figures.seconds
            cumulative, rendered = 0, []
            for bound, n in zip((*HANDLING_BUCKETS, float("inf")), buckets, strict=True):
                cumulative += n
                rendered.append(("+Inf" if bound == float("inf") else f"{bound:g}", cumulative))
            handling.add_metric([figures.name], rendered, total)
        yield handled
        yield handling
        yield from lag_families(self.lags)


class ConsumerFigures:
    """One consumer's counts and handling times, added to by the event loop."""

    __slots__ = ("buckets", "counts", "name", "seconds")

    def __init__(self, name: str):
        self.name = name
        self.counts: dict[tuple[str, str], int] = {}
        """(subject as delivered, outcome) -> events."""
        self.buckets = [0] * (len(HANDLING_BUCKETS) + 1)
        """Handlings per bucket of HANDLING_BUCKETS, not cumulative; the last: above the largest bound."""
        self.seconds = 0.0
        """The handlings' total time."""

    def count(self, subject: str, outcome: str) -> None:
        """One event on `subject` (as delivered, with its tenant) ended with `outcome`."""
        counts, key = self.counts, (subject, outcome)
        counts[key] = counts.get(key, 0) + 1

    def observe(self, seconds: float) -> None:
        """One handling took `seconds`."""
        self.buckets[bisect_left(HANDLING_BUCKETS, seconds)] += 1
        self.seconds += seconds


def lag_families(lags: tuple[ConsumerLag, ...]) -> Iterator[Metric]:
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
