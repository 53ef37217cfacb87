"""Reading the platform's service processes' own /metrics as Prometheus would: where each one serves them (the
targets file `gpuyard up` writes), and the figures of their bus consumers."""

from __future__ import annotations

import json

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.supervisor.scrapeconfig import TARGETS_FILE

from .conftest import Platform


def metrics_addresses(platform: Platform) -> dict[str, str]:
    """`host:port` of each process's /metrics, by process name (submit, scheduler, executor, executor-1, ...)."""
    targets = json.loads((platform.data_dir / TARGETS_FILE).read_text())
    return {t["labels"]["process"]: t["targets"][0] for t in targets}


def scrape(address: str, token: str | None = None) -> dict[str, list]:
    """Each family's samples, by sample name (`token`: the scrape token, sent as Prometheus sends it)."""
    headers = {"Authorization": f"Bearer {token}"} if token else None
    text = httpx.get(f"http://{address}/metrics", headers=headers, timeout=10).raise_for_status().text
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(sample)
    return samples


def handled(
    samples: dict[str, list], consumer: str, outcome: str = "ok", subject: str | None = None
) -> float:
    """How many events the consumer (or watch) `consumer` handled with `outcome`, on `subject` or any."""
    return sum(
        s.value
        for s in samples.get("gpuyard_bus_events_handled_total", [])
        if s.labels["consumer"] == consumer
        and s.labels["outcome"] == outcome
        and subject in (None, s.labels["subject"])
    )


def lag_of(samples: dict[str, list], consumer: str) -> list:
    """The consumer's backlog gauge (one sample, once its lag has been read; none before)."""
    return [
        s
        for s in samples.get("gpuyard_bus_consumer_pending_messages", [])
        if s.labels["consumer"] == consumer
    ]


def ack_pending_of(samples: dict[str, list], consumer: str) -> list:
    """The consumer's gauge of events delivered and not acknowledged yet (as `lag_of`)."""
    return [
        s
        for s in samples.get("gpuyard_bus_consumer_ack_pending_messages", [])
        if s.labels["consumer"] == consumer
    ]


def handling_count(samples: dict[str, list], consumer: str) -> float:
    """How many handlings of the consumer's handler were timed (each event it handled: ok or not)."""
    return sum(
        s.value
        for s in samples.get("gpuyard_bus_event_handling_seconds_count", [])
        if s.labels["consumer"] == consumer
    )
