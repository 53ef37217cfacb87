"""What a bus message's headers say of its event, read without decoding it: its id, its entity (a job's id),
the store version it was written at, who holds a placement. `Bus.publish` writes them; a consumer's `wanted`
reads them to pass over an event it has nothing to do with."""

from __future__ import annotations

from collections.abc import Callable

from nats.aio.msg import Msg

from gpuyard.shared.contracts.events.subjects import ATTEMPT_STOPS

VERSION_HEADER = "Gpuyard-Version"  # the store version the event was written at (`Bus.publish`)
MSG_ID_HEADER = "Nats-Msg-Id"  # the event's id: JetStream drops a second publish of it (`Bus.publish`)
ENTITY_HEADER = "Gpuyard-Entity"  # the event's entity (a job's id): a consumer may pass over it undecoded
HOLDER_HEADER = "Gpuyard-Holder"  # who holds a placement's replicas (JobPlaced.holder), told without a decode
_ATTEMPT_STOP_PREFIXES = tuple(f"{subject.value}." for subject in ATTEMPT_STOPS)


def entity_of(msg: Msg) -> str | None:
    """The entity (a job's id) of a message's event, when its publisher said so."""
    return (msg.headers or {}).get(ENTITY_HEADER)


def event_id_of(msg: Msg) -> str | None:
    """The id of a message's event, when its publisher said so (`Nats-Msg-Id`, which `Bus.publish` sets)."""
    return (msg.headers or {}).get(MSG_ID_HEADER)


def placed_for(holder: str) -> Callable[[Msg], bool]:
    """`wanted` for a consumer of placements: False for a placement whose replicas another service of the node
    holds (its `Gpuyard-Holder` header), which is then passed over undecoded; a placement without the header
    is decoded."""

    def wanted(msg: Msg) -> bool:
        named = (msg.headers or {}).get(HOLDER_HEADER)
        return named is None or named == holder

    return wanted


def concerns_holder(msg: Msg, holds: Callable[[str], bool]) -> bool:
    """Whether a control event may concern a host of replicas, told from its subject and headers without
    decoding it: an attempt's stop or end (`ATTEMPT_STOPS`) only when `holds(job_id)`; a cancel request
    always (of a job placed on the host and not started yet, too), and so does an event whose publisher did
    not name its job."""
    if not msg.subject.startswith(_ATTEMPT_STOP_PREFIXES):
        return True
    job_id = entity_of(msg)
    return job_id is None or holds(job_id)
