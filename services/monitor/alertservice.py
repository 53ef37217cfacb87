"""The monitor's alerts, as a service: feeds the engine (`gpuyard.services.monitor.alerts`) with what the bus and the
stores say, records what it raises and resolves in the event store (`gpuyard.shared.stores.readmodels.alertbook`), publishes it, and
delivers every alert on the bus to the webhooks (`gpuyard.services.monitor.webhooks`).

- One monitor runs per node, and one of them evaluates the rules: the holder of the `monitor-alerts` lease
  (`gpuyard.shared.runtime.lease`). A new holder reads the active alerts from the store first, so it raises none again.
- It watches `gpu.sample`, `node.heartbeat` and `dev.activity` (telemetry: `monitor-alerts-telemetry` in the bus figures of
  /metrics) and `node.lost` (events: `monitor-alerts-node-lost`); every JOB_POLL_SECONDS (or
  a quarter of a job rule's `for`, when shorter) it takes the jobs waiting and running from the monitor's live
  jobs (`gpuyard.services.monitor.jobs.LiveJobs`, which re-reads only the jobs that changed), and how much output each
  running replica has from the log store (its extent: one indexed read, no bytes).
- The same leader decides the idle-GPU reclaim (`gpuyard.services.monitor.idlereclaim`) from the samples it watches:
  it records and publishes `idle.warning` and `idle.stop` (`gpuyard.shared.stores.readmodels.idlebook`), and raises and resolves their
  `job_idle` alerts like its own.
- Every monitor follows `alert.>` with one shared durable consumer (`monitor-alerts`): each alert, raised by
  any service (the executor raises memory-slice alerts too), is recorded in the store once and handed to the
  webhook queues, then acknowledged.

Entry: `run_alerts(service, settings)`, from the monitor's main; or `python -m gpuyard.services.monitor.alertservice`
runs it alone as a monitor process.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from datetime import UTC, datetime

from nats.aio.msg import Msg

from gpuyard.services.monitor.alerts import ActiveAlert, Change, Engine, JobSnapshot, Raise
from gpuyard.services.monitor.idlereclaim import Action, IdleReclaim, Record
from gpuyard.services.monitor.jobs import LiveJob, LiveJobs
from gpuyard.services.monitor.rules import Rules, RulesError, load_rules, rules_refusal
from gpuyard.services.monitor.webhooks import Webhooks
from gpuyard.shared.bus.headers import entity_of
from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.bus.outbox import publish_recorded
from gpuyard.shared.contracts.events.alerts import AlertKind, AlertRaised, AlertResolved
from gpuyard.shared.contracts.events.dev import DevActivity
from gpuyard.shared.contracts.events.envelope import CloudEvent, make_event
from gpuyard.shared.contracts.events.nodes import GpuSample, NodeHeartbeat, NodeLost
from gpuyard.shared.contracts.events.subjects import EVENTS_STREAM, TELEMETRY_STREAM, Subject, Wildcard
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.runtime.handlers import HandlerTable
from gpuyard.shared.runtime.lease import Lease
from gpuyard.shared.runtime.service import Service, run_service
from gpuyard.shared.settings.common import EXIT_REFUSED
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.stores.events import EventStore
from gpuyard.shared.stores.logs import LogKey, LogStore
from gpuyard.shared.stores.readmodels import idlebook
from gpuyard.shared.stores.readmodels.alertbook import AlertBook

log = logging.getLogger(__name__)

LEASE = "monitor-alerts"
DURABLE = "monitor-alerts"
TELEMETRY_WATCH = "monitor-alerts-telemetry"
NODE_LOST_WATCH = "monitor-alerts-node-lost"
"""The names of the rules' watches: their `consumer` label in the bus figures of /metrics."""
JOB_POLL_SECONDS = 15.0
TICK_SECONDS = 5.0
SENT_REMEMBERED = 10_000
"""Alert event ids handed to the webhooks that are remembered, so that one recorded and re-published is sent
once."""
PAGE = 500


class AlertService:
    def __init__(
        self,
        service: Service,
        rules: Rules,
        store: EventStore,
        logs: LogStore | None,
        webhooks: Webhooks,
        *,
        instance: str,
        live: LiveJobs | None = None,
        idle: IdleReclaim | None = None,
    ):
        """`live`: the monitor's live jobs, refreshed by the monitor; without it the service keeps its own.
        `idle`: the idle-GPU reclaim, on those live jobs (none: no job is stopped for idle GPUs)."""
        self.service = service
        self.bus: Bus = service.bus
        self.rules = rules
        self.store = store
        self.logs = logs
        self.webhooks = webhooks
        self.book = AlertBook(store)
        self.live = live or LiveJobs(store)
        waiting = rules.job_waiting  # (the queued jobs the job-waiting alert may concern)
        self.live.waiting_after = waiting.for_ if waiting.enabled else None
        self.refreshes_live = live is None
        self.engine = Engine(rules)
        self.idle = idle
        self.leading = False
        self.sent: OrderedDict[str, None] = OrderedDict()
        self.lease = Lease(self.bus, LEASE, instance, replicas=self.bus.replicas)
        self.applying = asyncio.Lock()

    # ------------------------------------------------------------------ leading

    async def gained(self) -> None:
        async with self.applying:
            self.engine = Engine(self.rules)
            active = await self.book.load()
            now = datetime.now(UTC)
            restored = [ActiveAlert(v.raised, v.raised_id, v.raised_at) for v in active]
            self.engine.restore(restored, now)
            if self.idle is not None:
                self.idle.restore(restored)
            self.leading = True
        log.info("evaluating the alert rules (%d alert(s) active)", len(active))

    async def lost(self) -> None:
        self.leading = False

    async def lead(self) -> None:
        """Hold the lease while this runs; a failure to take over (the store away) lets the lease go and tries
        again a moment later."""
        while True:
            try:
                await self.lease.keep(self.gained, self.lost)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.leading = False
                log.warning("alert rules: cannot lead now, trying again: %s", exc)
            await asyncio.sleep(1)

    # ------------------------------------------------------------------ observations

    async def on_sample(self, data: GpuSample, event: CloudEvent) -> None:
        if not self.leading:
            return
        await self.apply(self.engine.sample(data, event.time))
        if self.idle is not None:
            await self.reclaim(self.idle.sample(data, event.time))

    async def on_dev_activity(self, data: DevActivity, event: CloudEvent) -> None:
        if self.leading and self.idle is not None:
            await self.reclaim(self.idle.activity(data))

    async def on_heartbeat(self, data: NodeHeartbeat, event: CloudEvent) -> None:
        if self.leading:
            await self.apply(self.engine.node_heartbeat(data.node, event.time))

    def wanted(self, msg: Msg) -> bool:
        """Whether a telemetry message is worth decoding (the watch's filter, told from the message's subject
        and headers before any decode): none while another monitor leads, and a node's heartbeat only while
        that node has a node_lost alert."""
        if not self.leading:
            return False
        if msg.subject == Subject.NODE_HEARTBEAT.value:
            return f"{AlertKind.NODE_LOST}/{entity_of(msg)}" in self.engine.trackers
        return True

    async def on_node_lost(self, data: NodeLost, event: CloudEvent) -> None:
        if self.leading:
            await self.apply(self.engine.node_lost(data.node, event.time, data.last_seen))

    @property
    def job_poll_seconds(self) -> float:
        """JOB_POLL_SECONDS, or a quarter of a job rule's `for` when that is shorter (at least TICK_SECONDS)."""
        shortest = min(self.rules.job_waiting.for_, self.rules.job_silent.for_)
        return max(TICK_SECONDS, min(JOB_POLL_SECONDS, shortest / 4))

    async def poll(self) -> None:
        """The jobs, every `job_poll_seconds`; the time, every TICK_SECONDS."""
        polled = 0.0
        loop = asyncio.get_running_loop()
        while True:
            if self.leading:
                try:
                    if loop.time() - polled >= self.job_poll_seconds:
                        queued, running = await self.jobs()
                        await self.apply(self.engine.jobs(queued, running, datetime.now(UTC)))
                        polled = loop.time()
                    await self.apply(self.engine.tick(datetime.now(UTC)))
                    if self.idle is not None:
                        await self.reclaim(self.idle.jobs(datetime.now(UTC)))
                except Exception as exc:  # the store away for a moment: the next turn tries again
                    log.warning("alert rules: %s", exc)
            await asyncio.sleep(TICK_SECONDS)

    async def jobs(self) -> tuple[list[JobSnapshot], list[JobSnapshot]]:
        if self.refreshes_live:
            await self.live.refresh()
        queued: list[JobSnapshot] = []
        running: list[JobSnapshot] = []
        for job in list(self.live.jobs.values()):
            if job.state == JobState.QUEUED:
                queued.append(JobSnapshot(job.job_id, job.tenant, job.user, job.name, job.since))
            elif (
                job.state == JobState.RUNNING and not job.serves
            ):  # a model server idle between requests is not stuck
                output = await self.output(job)
                running.append(JobSnapshot(job.job_id, job.tenant, job.user, job.name, job.since, output))
        return queued, running

    async def output(self, job: LiveJob) -> int | None:
        if self.logs is None:
            return None
        total = 0
        for replica in range(job.replicas):
            extent = await self.logs.extent(LogKey(job.job_id, job.attempt, replica))
            total += extent.end if extent else 0
        return total

    # ------------------------------------------------------------------ what the engine decided

    async def apply(self, changes: list[Change]) -> None:
        """Record each change in the store, then publish it (what is not published is the outbox relay's)."""
        if not changes:
            return
        async with self.applying:
            for change in changes:
                event = make_event(
                    change.data, source=self.service.source, id=change.event_id, time=change.at
                )
                raised_id = None if isinstance(change, Raise) else change.raised_id
                try:
                    await self.book.record(event, raised_id=raised_id)
                except Exception as exc:  # published all the same: the consumer of alert.> records it later
                    log.warning("recording %s %s failed: %s", event.type, event.id, exc)
                log.log(
                    logging.WARNING if isinstance(change, Raise) else logging.INFO,
                    "%s %s: %s",
                    "raised" if isinstance(change, Raise) else "resolved",
                    change.data.alert_id,
                    change.data.message,
                )
                await publish_recorded(self.bus, event, self.store)

    async def reclaim(self, actions: list[Action]) -> None:
        """What the idle-GPU reclaim decided, in order: an idle event is recorded in its job's idle stream, then
        published (a failed publish is left to the outbox relay); an alert change is applied as the engine's."""
        for action in actions:
            if not isinstance(action, Record):
                await self.apply([action])
                continue
            event = make_event(action.data, source=self.service.source, id=action.event_id, time=action.at)
            try:
                await idlebook.record(self.store, event)
            except Exception as exc:  # the store away: a stop is decided again at the next sample
                log.warning("recording %s %s failed: %s", event.type, event.id, exc)
                if self.idle is not None:
                    self.idle.unrecorded(action)
                continue
            log.warning("%s job %s attempt %d: %s", event.type, action.data.job_id, action.data.attempt,
                        action.data.message)  # fmt: skip
            await publish_recorded(self.bus, event, self.store)

    # ------------------------------------------------------------------ every alert on the bus

    async def on_alert(self, _: AlertRaised | AlertResolved, event: CloudEvent) -> None:
        """Any service's alert: recorded once, and to the webhooks once."""
        await self.book.record(event)
        if event.id in self.sent:
            return
        self.sent[event.id] = None
        if len(self.sent) > SENT_REMEMBERED:
            self.sent.popitem(last=False)
        self.webhooks.send(event)

    # ------------------------------------------------------------------ running

    async def start(self) -> None:
        self.webhooks.start()
        await self.lease.open()
        alerts = HandlerTable({(AlertRaised, AlertResolved): self.on_alert})
        await self.bus.consume(
            DURABLE,
            [Wildcard.ALERT.value],  # (alert.>: alert.raised and alert.resolved, the two the table handles)
            alerts,
            stream=EVENTS_STREAM.name,
            max_deliver=self.service.settings.max_deliver,
        )
        telemetry = HandlerTable(
            {GpuSample: self.on_sample, NodeHeartbeat: self.on_heartbeat, DevActivity: self.on_dev_activity}
        )
        await self.bus.watch(
            telemetry.subject_filters(),
            telemetry,
            stream=TELEMETRY_STREAM.name,
            wanted=self.wanted,
            name=TELEMETRY_WATCH,
        )
        node_lost = HandlerTable({NodeLost: self.on_node_lost})
        await self.bus.watch(
            node_lost.subject_filters(), node_lost, stream=EVENTS_STREAM.name, name=NODE_LOST_WATCH
        )

    async def run(self, stopping: asyncio.Event) -> None:
        await self.start()
        tasks = [
            asyncio.create_task(self.lead(), name="alerts-lease"),
            asyncio.create_task(self.poll(), name="alerts-poll"),
        ]
        try:
            await stopping.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.webhooks.close()


async def run_alerts(service: Service, settings: MonitorSettings, live: LiveJobs | None = None) -> None:
    """The monitor's alerts until the service stops: call it from the monitor's main (a task of its own), with
    the monitor's live jobs (`live`, which it refreshes); without them it reads its own."""
    try:
        rules = load_rules(settings.alert_rules)
    except RulesError as exc:
        log.error("monitor refuses to start: %s", exc)
        raise SystemExit(EXIT_REFUSED) from None
    webhooks = Webhooks(
        settings.alert_webhooks, timeout=settings.webhook_timeout, max_backoff=settings.webhook_max_backoff
    )
    # (the monitor's event store, with the ledger's outbox relay, and its log store: needs_store, needs_logs)
    alerts = AlertService(
        service, rules, service.store, service.logs, webhooks, instance=settings.instance, live=live
    )
    alerts.idle = IdleReclaim.of(alerts.live, settings)
    await alerts.run(service.stopping)


if __name__ == "__main__":
    run_service(
        "monitor", MonitorSettings, run_alerts, needs_store=True, needs_logs=True, preflight=rules_refusal
    )
