"""The latest heartbeat of every node and service, kept from the bus for `GET /v1/nodes` and `/v1/services`,
with what the services' supervisor (`gpuyard up`) says of each process it runs (`service.status`), and the
latest `gpu.sample` of every node (the GPUs' live figures of `/v1/nodes`, what `gpuyard top` shows).

A service instance is named by its host and pid, so every restart is a new one: an instance silent for
FORGET_SERVICE_AFTER is forgotten (nodes keep their names and stay listed, lost or not).

A process that keeps crashing cannot say so itself, and the last heartbeats of the processes it was are
still fresh for a while: its supervisor's word wins. Every process a supervisor named (by host and pid) takes
the state of the latest status of that supervised process (`executor-1`…), restarting or crash-looping, with
its restarts and last words; one that never sent a heartbeat (it crashes before) is listed from the status
alone. A supervisor's status not repeated within three of its intervals no longer counts (it is gone). An
instance whose heartbeats stopped as long ago, and which no supervisor says is restarting, is silent.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuyard.shared.contracts.api.platform import ServiceOut, ServiceState
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData
from gpuyard.shared.contracts.events.nodes import GpuSample, NodeHeartbeat, NodeLost
from gpuyard.shared.contracts.events.services import (
    SERVICE_HEARTBEAT_SECONDS,
    ProcessState,
    ServiceHeartbeat,
    ServiceStatus,
)

FORGET_SERVICE_AFTER = 86400.0
RECENT_SECONDS = 3 * SERVICE_HEARTBEAT_SECONDS
"""Heartbeats, statuses and samples sent this long before the submit service starts are read again."""
SAMPLE_STALE_INTERVALS = 5
"""A node's latest gpu.sample is shown for this many of its intervals (and at least SAMPLE_STALE_MIN_SECONDS)."""
SAMPLE_STALE_MIN_SECONDS = 10.0

Supervised = tuple[str, str]
"""A supervised process: (host, the supervisor's name of it)."""
Recorder = Callable[[Any, CloudEvent], None]
"""`on_node_heartbeat(hb: NodeHeartbeat, event: CloudEvent)`: records what one model's event says."""


def _shape(hb: NodeHeartbeat) -> tuple:
    """What a node is as a job's placement sees it (its GPUs, CPUs and memory, its backend and the Python
    versions it builds job environments for)."""
    gpus = tuple((g.index, g.model, g.memory_bytes, g.uuid) for g in hb.gpus)
    return (hb.cpus, hb.memory_bytes, gpus, hb.labels.get("backend", ""), tuple(hb.pythons))


def _stale(seen: float, interval: float, now: float) -> bool:
    """Whether what was heard at `seen`, and is said every `interval`, is old news: three intervals missed."""
    return now - seen > 3 * interval + 5


class Telemetry:
    def __init__(self) -> None:
        self.nodes: dict[str, tuple[float, NodeHeartbeat]] = {}
        self.services: dict[str, tuple[float, ServiceHeartbeat]] = {}
        self.lost: set[str] = set()  # declared lost by the scheduler, and silent since
        self.statuses: dict[Supervised, tuple[float, ServiceStatus]] = {}
        """The latest status of each supervised process."""
        self.supervised: dict[tuple[str, int], Supervised] = {}
        """(host, pid) of every process a status named -> the supervised process it was."""
        self.samples: dict[str, tuple[float, GpuSample]] = {}
        """The latest gpu.sample of each node: (its time, the sample)."""
        self.node_shapes = 0
        """Counts the heartbeats of a node new, or changed in its GPUs, CPUs or memory."""
        self._pruned = 0.0
        self._following_since: float | None = None
        """When the following began (`replay_from`): an event sent before it was read again from the stream."""
        self._recorders = self.recorders()

    def latest_sample(self, node: str, now: float | None = None) -> tuple[float, GpuSample] | None:
        """The node's latest gpu.sample and its time, unless stale (older than its stale time)."""
        now = time.time() if now is None else now
        found = self.samples.get(node)
        if found is None:
            return None
        taken_at, sample = found
        if now - taken_at > max(SAMPLE_STALE_MIN_SECONDS, SAMPLE_STALE_INTERVALS * sample.interval_seconds):
            return None
        return found

    def recorders(self) -> dict[type[EventData], Recorder]:
        """What each event heard says, recorded by the recorder of its model."""
        return {
            GpuSample: self.on_gpu_sample,
            NodeHeartbeat: self.on_node_heartbeat,
            NodeLost: self.on_node_lost,
            ServiceHeartbeat: self.on_service_heartbeat,
            ServiceStatus: self.on_service_status,
        }

    def observe(self, event: CloudEvent) -> None:
        """Record what `event` says, as the bus's delivery of it does (an event of another model: nothing)."""
        record = self._recorders.get(type(event.data))
        if record is not None:
            record(event.data, event)

    def on_gpu_sample(self, sample: GpuSample, event: CloudEvent) -> None:
        taken_at = event.time.timestamp()
        held = self.samples.get(sample.node)
        if held is None or taken_at > held[0]:  # (a duplicate or an overtaken one changes nothing)
            self.samples[sample.node] = (taken_at, sample)

    def on_node_heartbeat(self, hb: NodeHeartbeat, event: CloudEvent) -> None:
        held = self.nodes.get(hb.node)
        if held is None or _shape(held[1]) != _shape(hb):
            self.node_shapes += 1
        self.nodes[hb.node] = (self._seen(event), hb)
        self.lost.discard(hb.node)

    def on_node_lost(self, lost: NodeLost, _event: CloudEvent) -> None:
        self.lost.add(lost.node)

    def on_service_heartbeat(self, hb: ServiceHeartbeat, event: CloudEvent) -> None:
        self.services[hb.instance] = (self._seen(event), hb)
        self._prune()

    def on_service_status(self, status: ServiceStatus, event: CloudEvent) -> None:
        key = (status.host, status.process)
        self.statuses[key] = (self._seen(event), status)
        self.supervised[status.host, status.pid] = key
        self._prune()

    def replay_from(self, now: float) -> datetime:
        """Follow from `now` on: an event sent before it is read again, and counts from when it was sent.
        Returns when the replay begins (RECENT_SECONDS before)."""
        self._following_since = now
        return datetime.fromtimestamp(now - RECENT_SECONDS, UTC)

    def _seen(self, event: CloudEvent) -> float:
        """When an event was heard: now, or for one read again at start, when it was sent (never later than
        now, whatever the sender's clock)."""
        now = time.time()
        sent = event.time.timestamp()
        if self._following_since is not None and sent < self._following_since:
            return min(now, sent)
        return now

    def _prune(self) -> None:
        now = time.time()
        if now - self._pruned <= 60:
            return
        self._pruned = now
        for instance, (seen, _) in list(self.services.items()):
            if now - seen > FORGET_SERVICE_AFTER:
                del self.services[instance]
        for key, (seen, _) in list(self.statuses.items()):
            if now - seen > FORGET_SERVICE_AFTER:
                del self.statuses[key]
        heard = {(hb.host, hb.pid) for _, hb in self.services.values()}
        current = {(s.host, s.pid) for _, s in self.statuses.values()}
        for process in list(self.supervised):
            if process not in heard and process not in current:
                del self.supervised[process]

    def live_nodes(self, now: float | None = None) -> list[NodeHeartbeat]:
        """The nodes that announced themselves lately (within three of their heartbeat intervals) and were not
        declared lost since: the cluster a new job could run on."""
        now = time.time() if now is None else now
        return [
            hb
            for seen, hb in self.nodes.values()
            if hb.node not in self.lost and not _stale(seen, hb.interval_seconds, now)
        ]

    def service_list(self, now: float | None = None) -> list[ServiceOut]:
        """Every service instance heard from, and every supervised process not running that never was, with
        its state, by service and instance."""
        now = time.time() if now is None else now
        statuses = {
            key: (seen, status)
            for key, (seen, status) in self.statuses.items()
            if not _stale(seen, status.interval_seconds, now)
        }
        found = []
        for seen, hb in self.services.values():
            key = self.supervised.get((hb.host, hb.pid))
            latest = statuses.get(key) if key is not None else None
            status = latest[1] if latest is not None else None
            found.append(
                ServiceOut(
                    service=hb.service,
                    instance=hb.instance,
                    host=hb.host,
                    pid=hb.pid,
                    version=hb.version,
                    last_seen_seconds_ago=round(now - seen, 1),
                    metrics=hb.metrics,
                    **_state(status, silent=_stale(seen, SERVICE_HEARTBEAT_SECONDS, now)),
                )
            )
        heard = {(hb.host, hb.pid) for _, hb in self.services.values()}
        for seen, status in statuses.values():
            if status.state is not ProcessState.RUNNING and (status.host, status.pid) not in heard:
                found.append(
                    ServiceOut(
                        service=status.service,
                        instance=f"{status.host}-{status.pid}",  # as it names itself (CommonSettings.instance)
                        host=status.host,
                        pid=status.pid,
                        version=status.version,
                        last_seen_seconds_ago=round(now - seen, 1),
                        **_state(status, silent=False),
                    )
                )
        return sorted(found, key=lambda s: (s.service, s.instance))


def _state(status: ServiceStatus | None, *, silent: bool) -> dict[str, Any]:
    """The state fields of a row of `/v1/services`: its supervisor's word when it says the process is not
    running, else running, or silent by its heartbeats."""
    if status is not None and status.state is not ProcessState.RUNNING:
        return {
            "state": ServiceState(status.state.value),
            "restarts": status.restarts,
            "exit_code": status.exit_code,
            "last_error": status.last_error,
        }
    return {
        "state": ServiceState.SILENT if silent else ServiceState.RUNNING,
        "restarts": status.restarts if status else 0,
    }
