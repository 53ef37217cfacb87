"""The Kubernetes backend behind the executor's lifecycle: `KubernetesController` (pods per replica) driven
through the same `Backend` interface as local processes.

- launch: creates the claims of the job's volumes (`volumeclaims.py`), then the attempt's pods (and headless
  Service), which mount them and, with the storage root's NFS export set, the job's checkpoint and output folders
  (`podvolumes.py`); a redelivered or repeated launch creates nothing twice. A refusal by the API server fails the
  attempt to start, with its message; so does a volume deleted since the job was submitted. Where volumes live
  in the object store (`volume_copy`), no claim: each pod copies them before the job starts (`volumecopy.py`).
- volumes: every `RECONCILE_EVERY_POLLS` polls, the claims of volumes deleted since are deleted.
- watching: `controller.poll()` every `poll_interval`; a replica's pod Running → `replicas_started`, finished
  → `replica_ended` with the outcome the pod's status gives (exit code, signal, OOMKilled, deadline, node
  lost, start failures with the kubelet's message, the last log lines).
- logs: each pod's log is copied into the replica's log file in the data directory (every `log_interval`
  while it runs, completely when it ends; first, where the pod copied volumes from the object store, what its
  init container said of the copies, as the platform's lines), so the submit API serves both backends' logs
  alike, with the same size cap and rotation, and the running replicas of a tenant hold at most its log budget of them together
  (`LogBudget`).
- stop: the pods are deleted with the grace as their termination grace period; every replica still running
  is reported ended by SIGTERM.
- adopt (after an executor restart): an attempt whose pods still exist is watched again; the controller then
  reports their state once more, which the executor records idempotently.
- outputs: with an output store (`outputs`) and the NFS export, once an attempt's last replica has ended (its
  pod finished, or deleted by a stop and gone), the job's output folder on the export, which the executor mounts
  at its own storage root, is copied to the store (what changed, `outputpublish.py`, as the local backend does)
  before that replica's end is reported; the last replica's log says what was copied, or why not, and a copy
  that fails never fails the job. The copy runs beside the polling, which goes on meanwhile.
- release: once the attempt is over its pods and Service are deleted (their logs are already copied).
- nodes: the cluster's GPU nodes, listed every heartbeat round (`nodes.py` says which and what each
  heartbeat holds), instead of the executor's own machine; a node that stops being announced (cordoned,
  NotReady, gone) is declared lost by the scheduler after its node timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

from gpuyard.services.executor.backend import AttemptLaunch, Backend, BackendEvents, NotOpened, poll_forever
from gpuyard.services.executor.exits import AttemptKey, ReplicaKey, replica_exit
from gpuyard.services.executor.kubernetes import labels as job_labels
from gpuyard.services.executor.kubernetes.api import KubeApiError
from gpuyard.services.executor.kubernetes.controller import KubernetesController
from gpuyard.services.executor.kubernetes.nodes import cluster_inventory
from gpuyard.services.executor.kubernetes.outcomes import ReplicaOutcome, ReplicaPhase
from gpuyard.services.executor.kubernetes.podvolumes import NO_STORAGE_NOTE
from gpuyard.services.executor.kubernetes.volumeclaims import ClaimRefused, VolumeClaims, VolumeLookup
from gpuyard.services.executor.kubernetes.volumecopy import COPY_CONTAINER, CopiedVolumes, VolumeCopy
from gpuyard.services.executor.logfile import LogBudget, RotatingLog
from gpuyard.services.executor.outputpublish import OutputPublisher
from gpuyard.shared.contracts.events.jobs import FailureReason, JobReplicaExited
from gpuyard.shared.contracts.events.nodes import NodeHeartbeat
from gpuyard.shared.runtime.paths import log_path
from gpuyard.shared.stores.logs import NOTE, LogKey
from gpuyard.shared.stores.logs.shipper import LogShipper

log = logging.getLogger(__name__)
RECONCILE_EVERY_POLLS = 30
"""The claims of deleted volumes are looked for every this many polls (a minute, at the default poll interval)."""
GONE_MARGIN_SECONDS = 10.0
"""A stopped attempt's pods are waited for this much longer than their termination grace before its outputs are
copied (the kubelet may be slow to kill them)."""
GONE_CHECK_SECONDS = 1.0


@dataclass
class _Mirror:
    sink: RotatingLog
    lines: int = 0
    last: float = field(default=0.0)
    copies_said: bool = False
    """Whether what the pod's init container said of its copies of volumes is in the log (or not to be)."""


NO_BUILDS = (
    "the Kubernetes backend runs a job in an image and builds no Python environment: give the job "
    "`environment: {image: ...}` holding its packages"
)


class KubernetesBackend(Backend):
    name = "kubernetes"
    runs_every_node = True

    def __init__(
        self,
        controller: KubernetesController,
        *,
        data_dir: Path,
        poll_interval: float = 2.0,
        log_interval: float = 5.0,
        log_max_bytes: int = 0,
        log_backups: int = 0,
        shipper: LogShipper | None = None,
        log_budget: LogBudget | None = None,
        volumes: VolumeLookup | None = None,
        volume_copy: VolumeCopy | None = None,
        outputs: OutputPublisher | None = None,
    ):
        """`volumes`: finds a tenant's volume (its size, its creation) in the event store; without it, a job that
        mounts volumes fails to start. `volume_copy`: volumes live in the object store, and pods copy them
        (`volumecopy.py`). `outputs`: copies jobs' outputs to the output store from the executor's storage root,
        where it mounts the NFS export; unused without the export (pods then have no output folder)."""
        self.controller = controller
        self.claims = VolumeClaims(controller.api, controller.config, volumes)
        self.volume_copy = volume_copy
        self.outputs = outputs if controller.config.nfs_export is not None else None
        self.publishing: set[asyncio.Task] = set()
        """The copies of outputs under way, each followed by its attempt's last replica's end."""
        self.copying: set[AttemptKey] = set()
        """Attempts whose pods copy volumes from the object store (their init container's log is copied too)."""
        self.polls = 0
        self.shipper = shipper
        self.data_dir = data_dir
        self.poll_interval = poll_interval
        self.log_interval = log_interval
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self.log_budget = log_budget
        self.tenants: dict[AttemptKey, str] = {}
        """The tenant of each attempt launched or adopted, whose log budget its mirrored logs count against."""
        self.live: dict[AttemptKey, dict[int, str]] = {}
        """Attempts launched or adopted: replica → GPUYARD node, for the replicas not yet ended."""
        self.mirrors: dict[ReplicaKey, _Mirror] = {}
        self.events: BackendEvents = NotOpened()
        self.poller: asyncio.Task | None = None
        self.lock = asyncio.Lock()
        self.skipped_nodes: dict[str, str] = {}
        """Nodes not announced in the last round, and why (logged when it changes)."""

    @property
    def limits(self) -> str:
        return "enforced by Kubernetes (each pod's CPU and memory requests equal its limits)"

    async def open(self, events: BackendEvents) -> None:
        self.events = events
        self.poller = asyncio.create_task(
            poll_forever(self.poll_once, self.poll_interval, "polling Kubernetes failed", log),
            name="kubernetes-poll",
        )

    async def poll_once(self) -> None:
        async with self.lock:
            outcomes = await self.controller.poll()
        for outcome in outcomes:
            await self._report(outcome)
        await self._copy_running_logs()
        if self.polls % RECONCILE_EVERY_POLLS == 0:
            await self.reconcile_claims()
        self.polls += 1

    async def reconcile_claims(self) -> None:
        """Delete the claims of deleted volumes (a failure is logged: the pods' polling goes on)."""
        try:
            await self.claims.reconcile()
        except Exception as exc:
            log.warning("looking for the claims of deleted volumes failed: %s", exc)

    async def _report(self, outcome: ReplicaOutcome) -> None:
        key = AttemptKey(outcome.job_id, outcome.attempt)
        nodes = self.live.get(key)
        if nodes is None or outcome.replica not in nodes:
            return  # not an attempt this executor runs (or a replica already reported ended)
        node = nodes[outcome.replica]
        if outcome.phase is ReplicaPhase.RUNNING:
            await self.events.replicas_started(key, node, [outcome.replica])
            return
        if not outcome.phase.finished:
            return
        nodes.pop(outcome.replica, None)
        if not nodes:
            self.live.pop(key, None)
            if self.outputs is not None:  # (beside the polling: a large copy holds up no other job's report)
                task = asyncio.create_task(
                    self._publish_then_end(key, outcome, node), name="kubernetes-outputs"
                )
                self.publishing.add(task)
                task.add_done_callback(self.publishing.discard)
                return
        await self._copy_log(key, outcome.replica, final=True)
        await self.events.replica_ended(outcome.exit(node))

    async def _publish_then_end(self, key: AttemptKey, outcome: ReplicaOutcome, node: str) -> None:
        await self._copy_log(key, outcome.replica, final=True, note=await self._publish(key))
        await self.events.replica_ended(outcome.exit(node))

    async def _publish(self, key: AttemptKey) -> str:
        """The job's outputs copied to the output store: the line for its log."""
        assert self.outputs is not None
        tenant = self.tenants.get(key, "")
        if not tenant:
            return "outputs: not copied to the output store (the job's tenant is not known)"
        return await self.outputs.publish(tenant, key[0])

    # ------------------------------------------------------------------ nodes

    async def nodes(self, own: NodeHeartbeat) -> list[NodeHeartbeat]:
        config = self.controller.config
        listed = await self.controller.api.list_nodes(config.node_selector or None)
        inventory = cluster_inventory(
            listed, config, interval_seconds=own.interval_seconds, labels={"limits": self.limits}
        )
        for name, why in sorted(inventory.skipped.items()):
            if self.skipped_nodes.get(name) != why:
                log.info("not announcing Kubernetes node %s: %s", name, why)
        self.skipped_nodes = inventory.skipped
        # every node's replicas are reached through this executor's gateway (exec, shell, ports: docs/access.md)
        return [hb.model_copy(update={"gateway": own.gateway}) for hb in inventory.heartbeats]

    # ------------------------------------------------------------------ logs

    def _mirror(self, key: AttemptKey, replica: int) -> _Mirror:
        ident = (*key, replica)
        mirror = self.mirrors.get(ident)
        if mirror is None:
            path = log_path(self.data_dir, key[0], key[1], replica)
            tenant = self.tenants.get(key, "")
            sink = RotatingLog(
                path,
                self.log_max_bytes,
                self.log_backups,
                shipper=self.shipper,
                key=LogKey(*key, replica),
                budget=self.log_budget if tenant else None,
                tenant=tenant,
            )
            mirror = _Mirror(sink)
            self.mirrors[ident] = mirror
        return mirror

    async def _copy_log(
        self, key: AttemptKey, replica: int, *, final: bool = False, keep_open: bool = False, note: str = ""
    ) -> None:
        """Append the pod's log lines not copied yet to the replica's log file; `final`: all of them, then `note`
        (the platform's line, e.g. what was copied to the output store), and the file is closed unless
        `keep_open` (a note is still to come: `_close_log`)."""
        mirror = self._mirror(key, replica)
        now = time.monotonic()
        if not final and now - mirror.last < self.log_interval:
            return
        mirror.last = now
        try:
            lines = await self.controller.logs(key[0], key[1], replica)
        except KubeApiError as exc:  # no pod yet, or its container has not started
            log.debug("no log yet for %s attempt %d replica %d: %s", key[0], key[1], replica, exc)
            lines = None
        if (lines is not None or final) and not mirror.copies_said:
            mirror.copies_said = True
            await self._say_copies(key, replica, mirror)
        if lines is not None:
            if len(lines) < mirror.lines:  # the kubelet rotated the container log: start over
                mirror.lines = 0
            new = lines[mirror.lines :]
            if new:
                mirror.sink.write(("\n".join(new) + "\n").encode())
                mirror.lines = len(lines)
        if final and not keep_open:
            self._close_log(key, replica, note)

    def _close_log(self, key: AttemptKey, replica: int, note: str = "") -> None:
        """The replica's log file closed, after `note` (the platform's line) when there is one."""
        mirror = self._mirror(key, replica)
        if note:
            mirror.sink.write(f"{NOTE}{note}\n".encode())
        mirror.sink.close()
        self.mirrors.pop((*key, replica), None)

    async def _say_copies(self, key: AttemptKey, replica: int, mirror: _Mirror) -> None:
        """What the pod's init container said of its copies of volumes (or why one failed), into its log."""
        if key not in self.copying:
            return
        try:
            said = await self.controller.logs(key[0], key[1], replica, container=COPY_CONTAINER)
        except KubeApiError as exc:
            log.debug("no copy log for %s attempt %d replica %d: %s", key[0], key[1], replica, exc)
            return
        if said:
            mirror.sink.write("".join(f"{NOTE}{line}\n" for line in said).encode())

    async def _copy_running_logs(self) -> None:
        for key, nodes in list(self.live.items()):
            for replica in list(nodes):
                await self._copy_log(key, replica)

    # ------------------------------------------------------------------ launch, stop, adopt, release

    async def launch(self, launch: AttemptLaunch) -> JobReplicaExited | None:
        wanted = launch.spec.environment
        if wanted is not None and wanted.wants_build:  # (a pod runs an image: it builds no environment)
            return launch.start_failed(NO_BUILDS)
        claims: dict[str, str] = {}
        copied: CopiedVolumes | None = None
        try:
            if self.volume_copy is not None:
                sizes = await self.claims.sizes(launch.tenant, launch.spec.volumes)
                copied = CopiedVolumes(self.volume_copy, sizes)
                if sizes:
                    self.copying.add(launch.key)
            else:
                claims = await self.claims.claim(launch.tenant, launch.spec.volumes)
        except ClaimRefused as exc:  # (a job is never run without the volumes it names)
            return launch.start_failed(str(exc))
        self.live[launch.key] = {r: launch.placement(r).node for r in launch.replicas}
        self.tenants[launch.key] = launch.tenant
        try:
            async with self.lock:
                result = await self.controller.launch(
                    job_id=launch.job_id,
                    attempt=launch.attempt,
                    job_name=launch.job_name,
                    tenant=launch.tenant,
                    spec=launch.spec,
                    placements=launch.placements,
                    claims=claims,
                    copied=copied,
                )
        except KubeApiError as exc:
            self.live.pop(launch.key, None)
            self.tenants.pop(launch.key, None)
            self.copying.discard(launch.key)
            with contextlib.suppress(KubeApiError):
                await self.controller.cancel(launch.job_id, launch.attempt, grace_seconds=0)
            return launch.start_failed(f"Kubernetes refused the job's pods: {exc.message}")
        if result.skipped:
            self.live.pop(launch.key, None)
            self.tenants.pop(launch.key, None)
            self.copying.discard(launch.key)
        return None

    def notes(self, key: AttemptKey) -> list[str]:
        return [] if self.controller.config.nfs_export is not None else [NO_STORAGE_NOTE]

    async def stop(self, key: AttemptKey, grace: float) -> None:
        nodes = self.live.pop(key, None)
        if not nodes:
            return
        last = max(nodes)
        for replica in nodes:  # (the last one's file stays open for the outputs' line)
            await self._copy_log(
                key, replica, final=True, keep_open=replica == last and self.outputs is not None
            )
        async with self.lock:
            await self.controller.cancel(key[0], key[1], grace_seconds=math.ceil(grace))
        if self.outputs is not None:  # (what the job writes in its grace is copied too)
            await self._gone(key, math.ceil(grace) + GONE_MARGIN_SECONDS)
            self._close_log(key, last, await self._publish(key))
        for replica, node in sorted(nodes.items()):
            await self.events.replica_ended(
                replica_exit(
                    job_id=key[0],
                    attempt=key[1],
                    replica=replica,
                    node=node,
                    signal=int(signal.SIGTERM),
                    reason=FailureReason.SIGNAL,
                    message=f"stopped: its pod was deleted (termination grace {math.ceil(grace)}s)",
                )
            )

    async def _gone(self, key: AttemptKey, within: float) -> bool:
        """Whether the attempt's pods are gone within `within` seconds (a deleted pod stays while it ends)."""
        selector = job_labels.selector_string(job_labels.attempt_selector(*key))
        deadline = time.monotonic() + within
        while await self.controller.api.list_pods(self.controller.namespace, selector):
            if time.monotonic() >= deadline:
                log.warning("job %s attempt %d: its pods are still there; copying its outputs", *key)
                return False
            await asyncio.sleep(GONE_CHECK_SECONDS)
        return True

    async def adopt(self, key: AttemptKey, replicas: dict[int, str], *, unannounced: bool = False) -> bool:
        selector = job_labels.selector_string(job_labels.attempt_selector(*key))
        pods = await self.controller.api.list_pods(self.controller.namespace, selector)
        if not pods:
            return False
        self.live[key] = dict(replicas)
        self.tenants[key] = pods[0].get("metadata", {}).get("labels", {}).get(job_labels.TENANT, "")
        if any((p.get("spec") or {}).get("initContainers") for p in pods):
            self.copying.add(key)
        return True

    async def release(self, key: AttemptKey) -> None:
        self.live.pop(key, None)
        self.tenants.pop(key, None)
        self.copying.discard(key)
        for ident in [i for i in self.mirrors if i[:2] == key]:
            self.mirrors.pop(ident).sink.close()
        async with self.lock:
            await self.controller.cancel(key[0], key[1])

    async def close(self, grace: float, *, stop_jobs: bool = True) -> None:  # pods stay, whatever the stop
        if self.poller is not None:
            self.poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.poller
        for task in list(self.publishing):  # (an adopting executor reports those ends, and copies again)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for mirror in self.mirrors.values():
            mirror.sink.close()
        self.mirrors.clear()
