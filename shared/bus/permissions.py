"""Who may do what on the bus: one NATS user per service role, and what each may publish and subscribe.

This table is the one definition: `gpuyard up` writes the nats-server configuration from it
(`gpuyard.supervisor.busconfig`), each service's outbox relay publishes only what its role may (`publishes`), and
docs/operations.md describes it. Event subjects come from `gpuyard.shared.contracts.events`; the rest is what the NATS client
library sends for the JetStream calls a role makes (`gpuyard.shared.bus`, `gpuyard.shared.runtime.lease`):

- declaring the streams (every service does at start-up): `$JS.API.STREAM.CREATE|UPDATE|INFO.<stream>`;
- following a stream (durable pull consumers, ordered watches): the consumer API of that stream, its acks
  (`$JS.ACK.<stream>.>`) and flow-control answers (`$JS.FC.<stream>.>`);
- the leader leases (the scheduler's, the monitor's alerts'): the KV bucket's stream and `$KV.<bucket>.>`;
- replies come to the role's own inbox prefix, `_INBOX.<role>.>` (`inbox_prefix`), not to every inbox.

Job events are published on their subject followed by the job's tenant (`job.placed.vision`), so a role's
right to publish one is `job.placed.*`, and the integrator of one tenant (`tenant_integrator`, a user made by
`gpuyard admin bus-user --tenant T`) may subscribe to `job.*.<T>` and nothing else: it reads live, with core
subscriptions, like the integrator of every tenant (it is given no JetStream API, whose consumers could be
created with any filter).

What stays broad: a role that follows a stream may create consumers on it with any filter, so it can read
every event of that stream (publishing is what the table restricts: a consumer cannot publish an event),
and a role that declares the streams may update their settings (it cannot delete or purge them).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from gpuyard.shared.bus.credentials import inbox_prefix
from gpuyard.shared.contracts.events.subjects import (
    DEADLETTER_STREAM,
    EVENTS_STREAM,
    STREAMS,
    TELEMETRY_STREAM,
    StreamDef,
    Subject,
    Wildcard,
    subject_filter,
    tenant_wildcard,
)
from gpuyard.shared.runtime.lease import LEASES_BUCKET


class Role(StrEnum):
    """A NATS user: the five services, the supervisor that runs them (`gpuyard up`), and a read-only user for
    integrations."""

    SUBMIT = "submit"
    SCHEDULER = "scheduler"
    EXECUTOR = "executor"
    MONITOR = "monitor"
    SERVING = "serving"
    SUPERVISOR = "supervisor"
    INTEGRATOR = "integrator"


SERVICE_ROLES = (Role.SUBMIT, Role.SCHEDULER, Role.EXECUTOR, Role.MONITOR, Role.SERVING)
EVENT_FAMILIES = tuple(dict.fromkeys(f"{s.value.split('.')[0]}.>" for s in Subject))
"""Every event subject, as one wildcard per family (job.>, node.>, gpu.>, ...): what a live reader of all
events subscribes to."""


@dataclass(frozen=True)
class Grant:
    publishes: frozenset[Subject]
    """The events this role creates (and its outbox relay may publish)."""
    listens: tuple[str, ...] = ()
    """Core NATS subscriptions (live, not stored)."""
    follows: tuple[StreamDef, ...] = ()
    """Streams it reads through JetStream consumers."""
    dead_letters: bool = False
    """It runs durable consumers, which send what they give up on to deadletter.<durable>."""
    reads_dead_letters: bool = False
    declares_streams: bool = True
    leases: bool = False
    """It holds a leader lease (the KV bucket of `gpuyard.shared.runtime.lease`)."""


HEARTBEAT = frozenset({Subject.SERVICE_HEARTBEAT})
MODEL_EVENTS = frozenset({Subject.MODEL_PUBLISHED, Subject.MODEL_VISIBILITY_CHANGED, Subject.MODEL_DELETED})
VOLUME_EVENTS = frozenset(s for s in Subject if s.value.startswith("volume."))
ATTEMPT_EVENTS = frozenset(
    {
        Subject.JOB_STARTED,
        Subject.JOB_REPLICA_EXITED,
        Subject.JOB_SUCCEEDED,
        Subject.JOB_FAILED,
        Subject.JOB_CANCELLED,
        Subject.JOB_REQUEUED,  # retries, and attempts whose replicas it lost
    }
)
"""What the host of a job's replicas records of an attempt, from its start to its end: the executor for
commands, the serving service for serve jobs (their replicas are its sessions: docs/architecture.md)."""
REPLICA_EVENTS = frozenset({Subject.MODEL_READY, Subject.MODEL_FAILED})

GRANTS: dict[Role, Grant] = {
    Role.SUBMIT: Grant(
        publishes=HEARTBEAT
        | {Subject.JOB_SUBMITTED, Subject.JOB_CANCEL_REQUESTED, Subject.JOB_CANCELLED}  # a queued job's
        | MODEL_EVENTS  # the API publishes models (`POST /v1/models`), also for jobs (their publish token)
        | VOLUME_EVENTS  # the API makes volumes and takes their uploads (`/v1/volumes`)
        | {Subject.JOB_CHECKPOINTED}  # what a job reports of its checkpoints (its checkpoint token)
        | {Subject.JOB_EXEC_STARTED}  # who opened an exec or shell into a job (`gpuyard exec`)
        | {Subject.NODE_CONTROL}  # an admin's cordon, drain, uncordon
        | {Subject.NODE_ENVIRONMENT_REMOVE}  # an admin's `gpuyard envs rm`
        | {Subject.DEV_ACTIVITY},  # a user's activity in a dev environment, seen by its proxy (telemetry)
        listens=EVENT_FAMILIES,  # the API's live event stream (SSE), node.lost
        follows=(TELEMETRY_STREAM,),  # the heartbeats and samples, the last few read again at start
        reads_dead_letters=True,
    ),
    Role.SCHEDULER: Grant(
        publishes=HEARTBEAT
        | {
            Subject.JOB_PENDING,
            Subject.JOB_PLACED,
            Subject.JOB_PREEMPTED,
            Subject.JOB_REQUEUED,  # the jobs of a lost node
            Subject.NODE_LOST,
        },
        # heartbeats live too: a telemetry stream that cannot store them must not get nodes declared lost
        listens=(Subject.NODE_HEARTBEAT.value,),
        follows=(EVENTS_STREAM, TELEMETRY_STREAM),
        leases=True,
    ),
    Role.EXECUTOR: Grant(
        publishes=HEARTBEAT
        | ATTEMPT_EVENTS
        | {
            Subject.NODE_HEARTBEAT,
            Subject.ALERT_RAISED,  # the GPU memory slice guard
            Subject.ALERT_RESOLVED,
        },
        # the other nodes' addresses; an admin's removal of a job environment (`gpuyard envs rm`)
        listens=(Subject.NODE_HEARTBEAT.value, Subject.NODE_ENVIRONMENT_REMOVE.value),
        follows=(EVENTS_STREAM,),
        dead_letters=True,
    ),
    Role.MONITOR: Grant(
        publishes=HEARTBEAT
        | {Subject.GPU_SAMPLE, Subject.NODE_GPU_HEALTH, Subject.ALERT_RAISED, Subject.ALERT_RESOLVED}
        | {Subject.IDLE_WARNING, Subject.IDLE_STOP},  # idle-GPU reclaim: the alert rules' monitor decides
        listens=(
            Subject.GPU_SAMPLE.value,
        ),  # every node's samples: one monitor's /metrics covers the cluster
        # the alert rules: gpu.sample, node.heartbeat and dev.activity (telemetry), node.lost and every alert
        # (events)
        follows=(EVENTS_STREAM, TELEMETRY_STREAM),
        dead_letters=True,  # its durable consumer of alert.> (the webhooks and the alerts' record)
        leases=True,  # one monitor evaluates the rules: the holder of the monitor-alerts lease
    ),
    Role.SERVING: Grant(  # hosts serve jobs: their placements, cancels and ends, and the replicas' readiness
        publishes=HEARTBEAT | ATTEMPT_EVENTS | REPLICA_EVENTS,
        follows=(EVENTS_STREAM,),  # job.placed, the control events, and the other nodes' model.ready
        dead_letters=True,
    ),
    Role.SUPERVISOR: Grant(  # says what it knows of the processes it runs; the services declare the streams
        publishes=frozenset({Subject.SERVICE_STATUS}), declares_streams=False
    ),
    Role.INTEGRATOR: Grant(publishes=frozenset(), listens=EVENT_FAMILIES, declares_streams=False),
}
NOT_PUBLISHED_YET: frozenset[Subject] = frozenset()
"""Subjects no service creates yet."""


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]


def _consumer_api(stream: str) -> list[str]:
    api = "$JS.API.CONSUMER"
    return [
        f"{api}.CREATE.{stream}",
        f"{api}.CREATE.{stream}.>",
        f"{api}.DURABLE.CREATE.{stream}.>",
        f"{api}.INFO.{stream}.>",
        f"{api}.DELETE.{stream}.>",
        f"{api}.MSG.NEXT.{stream}.>",
        f"$JS.ACK.{stream}.>",
        f"$JS.FC.{stream}.>",
    ]


def _stream_api(stream: str) -> list[str]:
    return [f"$JS.API.STREAM.{op}.{stream}" for op in ("CREATE", "UPDATE", "INFO")]


def permissions(role: Role) -> Permissions:
    """The NATS publish and subscribe allow-lists of `role` (everything else is denied)."""
    grant = GRANTS[role]
    publish = [subject_filter(s) for s in sorted(grant.publishes)]
    if grant.declares_streams:
        publish.append("$JS.API.INFO")
        for stream in STREAMS:
            publish += _stream_api(stream.name)
    for stream in grant.follows:
        publish += _consumer_api(stream.name)
    if grant.dead_letters:
        publish.append(Wildcard.DEADLETTER.value)
    if grant.reads_dead_letters:
        publish.append(f"$JS.API.STREAM.MSG.GET.{DEADLETTER_STREAM.name}")
    if grant.leases:
        kv = f"KV_{LEASES_BUCKET}"
        publish += [
            *_stream_api(kv),
            f"$JS.API.STREAM.MSG.GET.{kv}",
            f"$JS.API.DIRECT.GET.{kv}",
            f"$JS.API.DIRECT.GET.{kv}.>",
            f"$KV.{LEASES_BUCKET}.>",
        ]
    subscribe = [*grant.listens]
    if role is not Role.INTEGRATOR:
        subscribe.append(f"{inbox_prefix(role.value)}.>")
    return Permissions(tuple(dict.fromkeys(publish)), tuple(dict.fromkeys(subscribe)))


TENANT_INTEGRATOR_PREFIX = f"{Role.INTEGRATOR.value}-"


def tenant_integrator(tenant: str) -> str:
    """The bus user that reads one tenant's job events: `integrator-<tenant>` (ValueError for a tenant name
    that is not valid)."""
    tenant_wildcard(tenant)  # checks the name
    return TENANT_INTEGRATOR_PREFIX + tenant


def tenant_of_integrator(user: str) -> str | None:
    """The tenant whose integrator `user` is, None for any other user."""
    if not user.startswith(TENANT_INTEGRATOR_PREFIX):
        return None
    tenant = user.removeprefix(TENANT_INTEGRATOR_PREFIX)
    try:
        tenant_wildcard(tenant)
    except ValueError:
        return None
    return tenant


def tenant_permissions(tenant: str) -> Permissions:
    """The integrator of one tenant: subscribes to that tenant's job events (`job.*.<tenant>`), publishes
    nothing (no JetStream API either: it reads live)."""
    return Permissions(publish=(), subscribe=(tenant_wildcard(tenant),))


def publishes(name: str) -> frozenset[Subject] | None:
    """The subjects the service `name` may publish; None for a name that is not a role (every subject)."""
    try:
        return GRANTS[Role(name)].publishes
    except ValueError:
        return None


def publishers(subject: Subject) -> list[Role]:
    """The roles that may publish `subject`."""
    return [role for role, grant in GRANTS.items() if subject in grant.publishes]


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


def may_subscribe(role: Role, subject: str) -> bool:
    """Whether `role`'s bus user may subscribe to `subject` (one of its subscribe filters matches it)."""
    return any(subject_matches(pattern, subject) for pattern in permissions(role).subscribe)
