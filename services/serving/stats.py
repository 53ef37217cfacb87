"""Per-model request counts and latency histograms, kept in plain counters (cheap on the hot path) until the
service puts them on `/metrics`."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Upper bounds in seconds, as Prometheus histograms count them (`le`); a last bucket counts the rest."""


@dataclass
class ModelStats:
    success: int = 0
    failure: int = 0
    latency_sum: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS) + 1))
    """Requests per latency bucket, not cumulative; the last is over the largest bound."""

    def observe(self, seconds: float, ok: bool) -> None:
        if ok:
            self.success += 1
        else:
            self.failure += 1
        self.latency_sum += seconds
        self.buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1

    @property
    def count(self) -> int:
        return self.success + self.failure


class Stats:
    """ModelStats per (model, version) that answered; a request for an unknown model counts nowhere."""

    def __init__(self) -> None:
        self.models: dict[tuple[str, str], ModelStats] = {}

    def of(self, name: str, version: str) -> ModelStats:
        stats = self.models.get((name, version))
        if stats is None:
            stats = self.models[(name, version)] = ModelStats()
        return stats
