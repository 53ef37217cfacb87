"""Platform-wide reads: the live event stream (SSE), dead letters, nodes and services."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import StreamingResponse

from gpuyard.services.submit.auth import Admin, Context, CurrentPrincipal
from gpuyard.services.submit.errors import REFUSED_422, answers
from gpuyard.services.submit.streamview import JOB_CONTENT_HEADERS, Access, seen_by, while_allowed
from gpuyard.services.submit.telemetry import Telemetry
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.api.nodes import GpuHolderOut, GpuOut, NodeOut, NodeState
from gpuyard.shared.contracts.api.platform import DeadLetterOut, ServiceOut, ServiceState
from gpuyard.shared.contracts.events.envelope import CloudEvent
from gpuyard.shared.contracts.events.services import SERVICE_HEARTBEAT_SECONDS
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.stores.readmodels import nodecontrol

router = APIRouter(prefix="/v1", tags=["platform"], responses=answers(400, 401, 413))

PUBLIC_PREFIXES = tuple(dict.fromkeys(s.value.split(".")[0] for s in Subject))  # job, node, gpu, service…
JOB_PREFIX = Subject.JOB_SUBMITTED.value.split(".")[0]
SUBJECT_RE = re.compile(r"^[a-z_]+(\.([a-z0-9_-]+|\*))*(\.>)?$|^>$")
KEEPALIVE_SECONDS = 15


def _subjects(subject: str) -> list[str]:
    """The NATS subscriptions of a filter. Job events carry their tenant as a last token: a filter that names
    a job event's kind without it (`job.failed`, `job.*`) means every tenant's (`job.failed.*`)."""
    if not SUBJECT_RE.match(subject):
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"invalid subject filter {subject!r}")
    if subject == ">":
        return [f"{p}.>" for p in PUBLIC_PREFIXES]
    tokens = subject.split(".")
    if tokens[0] not in PUBLIC_PREFIXES:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"subject must start with one of {', '.join(PUBLIC_PREFIXES)} (or be '>')",
        )
    if tokens[0] == JOB_PREFIX and len(tokens) == 2 and tokens[1] != ">":
        return [f"{subject}.*"]
    return [subject]


@router.get("/events/stream", response_class=StreamingResponse, responses=answers(503) | REFUSED_422)
async def event_stream(
    request: Request,
    ctx: Context,
    principal: CurrentPrincipal,
    subject: Annotated[
        str, Query(description=f"NATS subject filter, e.g. job.> or {Subject.JOB_FAILED.value}")
    ] = ">",
    job: Annotated[str | None, Query(description="Only events about this job.")] = None,
):
    """Server-Sent Events: every new event matching the filter, as CloudEvents JSON, for integrations that
    cannot reach NATS (and the dashboard). A tenant receives the events of its own jobs and models, the alerts
    about its jobs, and GPU samples with other tenants' holders blanked. Job events' NATS subjects end with
    their job's tenant (`job.failed.vision`); `job.failed` stands for `job.failed.*`. The response starts (`:
    connected`) once the server listens: every event published after that comes; one from before never does,
    so a client that shows state reads it again each time it (re)connects. It lasts as long as the caller's
    token (or dashboard session) would still be taken: within a second of its revocation or expiry the stream
    ends, with a last comment that says why (`: access ended: …`); connecting again is then a 401."""
    if ctx.bus is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the event bus is not connected")
    subjects = _subjects(subject)
    queue: asyncio.Queue = asyncio.Queue(maxsize=10_000)

    async def on_msg(msg) -> None:
        with contextlib.suppress(asyncio.QueueFull):
            queue.put_nowait((msg.subject, msg.data))

    subs = [await ctx.bus.subscribe(s, on_msg) for s in subjects]

    async def frames():
        try:
            yield b": connected\n\n"
            while not await request.is_disconnected():
                try:
                    nats_subject, raw = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    yield b": keepalive\n\n"
                    continue
                try:
                    event = CloudEvent.from_json(raw)
                except ValueError:
                    continue
                if job is not None and getattr(event.data, "job_id", None) != job:
                    continue
                event = seen_by(principal, event, nats_subject)
                if event is not None:
                    yield f"id: {event.id}\nevent: {event.type}\ndata: {event.to_json().decode()}\n\n".encode()
        finally:
            for s in subs:
                with contextlib.suppress(Exception):
                    await s.unsubscribe()

    return StreamingResponse(
        while_allowed(frames(), Access(request, ctx, principal), farewell=access_ended),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", **JOB_CONTENT_HEADERS},
    )


def access_ended(why: str) -> bytes:
    """The event stream's last frame once its caller's credential is refused: a comment (no client takes it
    for an event) with the reason, on one line."""
    return f": access ended: {' '.join(why.split())}\n\n".encode()


def holder_out(principal: Principal, job_id: str, tenant: str, user: str, fraction: float) -> GpuHolderOut:
    """A GPU's holder as `principal` may see it: another tenant's job only as `other`, with its share."""
    if principal.admin or tenant == principal.tenant:
        return GpuHolderOut(job_id=job_id, tenant=tenant, user=user, fraction=fraction)
    return GpuHolderOut(fraction=fraction, other=True)


@router.get("/deadletters", response_model=list[DeadLetterOut], responses=answers(403, 503))
async def dead_letters(
    ctx: Context, _: Admin, limit: Annotated[int, Query(ge=1, le=500)] = 50
) -> list[DeadLetterOut]:
    """Events that a consumer gave up on, newest first, with the error (admin only)."""
    if ctx.bus is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "the event bus is not connected")
    return [DeadLetterOut.model_validate(d, from_attributes=True) for d in await ctx.bus.dead_letters(limit)]


@router.get("/nodes", response_model=list[NodeOut])
async def nodes(ctx: Context, principal: CurrentPrincipal) -> list[NodeOut]:
    """The nodes, each GPU with its live figures and holders from the node's latest `gpu.sample` (another
    tenant's holder only as `other`, with its share), its health and cordon, and each node's state."""
    now = time.time()
    controls = await nodecontrol.load_all(ctx.store)
    return [
        node_out(
            hb,
            seen,
            ctx.telemetry.latest_sample(hb.node, now),
            principal,
            now,
            hb.node in ctx.telemetry.lost,
            controls.get(hb.node),
        )
        for seen, hb in sorted(ctx.telemetry.nodes.values(), key=lambda x: x[1].node)
    ]


def node_state(lost: bool, control: nodecontrol.NodeControl | None) -> NodeState:
    if lost:
        return NodeState.LOST
    if control is not None and control.draining:
        return NodeState.DRAINING
    if control is not None and control.cordoned:
        return NodeState.CORDONED
    return NodeState.READY


def node_out(hb, seen: float, sampled, principal: Principal, now: float, lost: bool, control=None) -> NodeOut:
    readings = {r.index: r for r in sampled[1].gpus} if sampled is not None else {}
    control = control or nodecontrol.NodeControl(node=hb.node)

    def gpu_out(g) -> GpuOut:
        r = readings.get(g.index)
        c = control.gpu(g.index)
        marks = {
            "healthy": c.unhealthy is None,
            "unhealthy_reason": c.unhealthy,
            "cordoned": control.cordoned or c.cordoned,
        }
        if r is None:
            return GpuOut(index=g.index, uuid=g.uuid, model=g.model, memory_bytes=g.memory_bytes, **marks)
        return GpuOut(
            index=g.index,
            uuid=g.uuid,
            model=g.model,
            memory_bytes=g.memory_bytes,
            utilization_pct=r.utilization_pct,
            memory_used_bytes=r.memory_used_bytes,
            temperature_c=r.temperature_c,
            holders=[holder_out(principal, h.job_id, h.tenant, h.user, h.fraction) for h in r.holders],
            **marks,
        )

    return NodeOut(
        node=hb.node,
        state=node_state(lost, control),
        reason=control.reason,
        last_seen_seconds_ago=round(now - seen, 1),
        gpus=[gpu_out(g) for g in hb.gpus],
        cpus=hb.cpus,
        memory_bytes=hb.memory_bytes,
        simulated=hb.simulated,
        sampled_seconds_ago=round(now - sampled[0], 1) if sampled is not None else None,
        notes=hb.notes,
    )


GONE_AFTER_SECONDS = 16 * SERVICE_HEARTBEAT_SECONDS
"""A silent instance not heard from for this long (80 s: a minute after it is called silent) is no longer
listed."""


@router.get("/services", response_model=list[ServiceOut])
async def services(ctx: Context, _: CurrentPrincipal) -> list[ServiceOut]:
    """The platform's service processes, by service and instance, each with its state: a service that keeps
    crashing is `crash_looping`, with its restarts and the last line it wrote (its supervisor says so). An
    instance whose heartbeats stopped is `silent`, and no longer listed once a newer instance of its service
    on its host runs in its place (its supervisor restarted it), or 80 s after its last heartbeat."""
    return listed_services(ctx.telemetry, time.time())


def listed_services(telemetry: Telemetry, now: float) -> list[ServiceOut]:
    """`Telemetry.service_list` less the silent instances that are gone: not heard from for
    GONE_AFTER_SECONDS, or replaced (`_replaced`)."""
    rows = telemetry.service_list(now)
    return [
        row
        for row in rows
        if row.state is not ServiceState.SILENT
        or not (row.last_seen_seconds_ago > GONE_AFTER_SECONDS or _replaced(telemetry, row, rows, now))
    ]


def _replaced(telemetry: Telemetry, silent: ServiceOut, rows: list[ServiceOut], now: float) -> bool:
    """Whether another instance of the silent one's service on its host, not silent, has taken its place: the
    same process of their supervisor's (`executor-1` run again), or, where the supervisor does not name both,
    one that started after the silent one was last heard from (a restart by systemd, Kubernetes…)."""
    beats = {hb.instance: hb for _, hb in telemetry.services.values()}
    named = telemetry.supervised.get((silent.host, silent.pid))
    last_heard = now - silent.last_seen_seconds_ago
    for row in rows:
        if row.state is ServiceState.SILENT or (row.service, row.host) != (silent.service, silent.host):
            continue
        other = telemetry.supervised.get((row.host, row.pid))
        if named is not None and other is not None:
            if other == named and row.pid != silent.pid:
                return True
            continue  # (two processes of a supervisor's: executor-2 never takes executor-1's place)
        beat = beats.get(row.instance)
        if beat is not None and beat.started_at.timestamp() > last_heard:
            return True
    return False
