"""The envelope of every event (CloudEvents 1.0, structured mode), the registry of event models and their versions (`@event`, `@upcaster`), and ids."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpuyard.shared.contracts.events.subjects import JOB_SUBJECTS, Subject, _checked

TYPE_PREFIX = "io.gpuyard."


CONTENT_TYPE = "application/cloudevents+json"


_ID_NAMESPACE = uuid.UUID("6c1f7d3e-41a5-4f0e-9a57-6f1d0c1b9a11")


_ID_NAMESPACE_BYTES = _ID_NAMESPACE.bytes


def utcnow() -> datetime:
    return datetime.now(UTC)


def new_id() -> str:
    return uuid.uuid4().hex


def derived_id(*parts: object) -> str:
    """A deterministic event id: the same fact (job, attempt, kind…) always gets the same id.

    This is what makes a repeated effect harmless: the store refuses a second event with the same id,
    and JetStream drops a second publish with the same Nats-Msg-Id.
    """
    # uuid.uuid5(_ID_NAMESPACE, name).hex, computed directly at a third of its cost: SHA-1 of the namespace
    # and the name, version 5 and the RFC 4122 variant set in its first 16 bytes
    digest = bytearray(hashlib.sha1(_ID_NAMESPACE_BYTES + "/".join(map(str, parts)).encode()).digest()[:16])
    digest[6] = (digest[6] & 0x0F) | 0x50
    digest[8] = (digest[8] & 0x3F) | 0x80
    return digest.hex()


class EventData(BaseModel):
    """Base of every event payload. Readers tolerate fields they do not know (forward compatible)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    subject: ClassVar[Subject]
    schema_version: ClassVar[int] = 1  # see `event` and `upcaster`

    def entity(self) -> str | None:
        """The CloudEvents `subject` attribute: which job/node/model this event is about."""
        return getattr(self, "job_id", None) or getattr(self, "node", None) or getattr(self, "name", None)


Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


REGISTRY: dict[Subject, type[EventData]] = {}


UPCASTERS: dict[tuple[Subject, int], Upcaster] = {}  # (subject, version) -> its data as version + 1 has it


def event(subject: Subject, *, version: int = 1):
    """Register the model of `subject`'s data, at `version` (bumped by one with every change of the model,
    with an `upcaster` for the step)."""

    def register(cls: type[EventData]) -> type[EventData]:
        if subject in REGISTRY:
            raise RuntimeError(f"two event models for {subject}")
        if version < 1:
            raise RuntimeError(f"{subject}: versions start at 1, not {version}")
        cls.subject = subject
        cls.schema_version = version
        REGISTRY[subject] = cls
        return cls

    return register


def upcaster(subject: Subject, *, from_version: int):
    """Register `fn(data) -> data`: the `data` dict of a `subject` event of `from_version`, upgraded to
    `from_version + 1` (a new dict; renamed fields renamed, added ones given their value for old events)."""

    def register(fn: Upcaster) -> Upcaster:
        if (subject, from_version) in UPCASTERS:
            raise RuntimeError(f"two upcasters for {subject} from version {from_version}")
        UPCASTERS[subject, from_version] = fn
        return fn

    return register


class EventVersionError(ValueError):
    """An event whose data version this reader cannot read: newer than its model, or with no upcaster."""


def upcast(subject: Subject, data: dict[str, Any], version: int) -> dict[str, Any]:
    """`data` of a `subject` event of `version`, as the registered model (its current version) reads it."""
    current = REGISTRY[subject].schema_version
    if version == current:
        return data
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise EventVersionError(
            f"{subject} event: dataversion must be a whole number from 1, not {version!r}"
        )
    if version > current:
        raise EventVersionError(
            f"{subject} event of data version {version} is newer than this reader's model (version {current}):"
            " upgrade GPUYard to read it"
        )
    for step in range(version, current):
        up = UPCASTERS.get((subject, step))
        if up is None:
            raise EventVersionError(f"{subject} event: no upcaster from data version {step} to {step + 1}")
        data = up(dict(data))
    return data


def missing_upcasters() -> list[tuple[Subject, int]]:
    """(subject, from_version) of every step no upcaster covers: empty when every model reads all its versions."""
    return [
        (subject, v)
        for subject, model in REGISTRY.items()
        for v in range(1, model.schema_version)
        if (subject, v) not in UPCASTERS
    ]


class CloudEvent(BaseModel):
    """A CloudEvents 1.0 event, structured mode. `data` is the typed payload for `type`."""

    model_config = ConfigDict(frozen=True)

    specversion: Literal["1.0"] = "1.0"
    id: str = Field(default_factory=new_id)
    source: str
    type: str
    subject: str | None = None
    time: datetime = Field(default_factory=utcnow)
    datacontenttype: Literal["application/json"] = "application/json"
    dataversion: int = Field(1, description="Version of the data's model (an extension attribute).")
    data: EventData

    @model_validator(mode="before")
    @classmethod
    def _typed_data(cls, values: Any) -> Any:
        """Raw data becomes its model (upgraded from an older version first); the envelope always names the
        version of the data it holds."""
        if not isinstance(values, dict):
            return values
        data = values.get("data")
        if isinstance(data, dict):
            subject = subject_of_type(values.get("type", ""))
            model = REGISTRY.get(subject)
            if model is None:
                raise ValueError(f"no event model for {subject}")
            version = values.get("dataversion", 1)
            if version != model.schema_version:
                data = upcast(subject, data, version)
            return {**values, "data": model.model_validate(data), "dataversion": model.schema_version}
        if isinstance(data, EventData) and values.get("dataversion") != data.schema_version:
            return {**values, "dataversion": data.schema_version}
        return values

    @property
    def nats_subject(self) -> Subject:
        """What kind of event it is (its `type` as a Subject); the subject it is published on is
        `subject_of(event, tenant)`."""
        return subject_of_type(self.type)

    def to_json(self) -> bytes:
        return self.model_dump_json(serialize_as_any=True).encode()

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json", serialize_as_any=True)

    @classmethod
    def from_json(cls, raw: bytes | str) -> CloudEvent:
        return cls.model_validate_json(raw)


def type_of(subject: Subject) -> str:
    return TYPE_PREFIX + subject.value


_SUBJECT_OF_TYPE = {type_of(s): s for s in Subject}  # (Subject(value) costs microseconds on every event)


def subject_of_type(ce_type: str) -> Subject:
    subject = _SUBJECT_OF_TYPE.get(ce_type)
    if subject is not None:
        return subject
    if not ce_type.startswith(TYPE_PREFIX):
        raise ValueError(f"not a GPUYARD event type: {ce_type!r}")
    raise ValueError(f"unknown event type {ce_type!r}")


def make_event(
    data: EventData, *, source: str, id: str | None = None, time: datetime | None = None
) -> CloudEvent:
    return CloudEvent(
        id=id or new_id(),
        source=source,
        type=type_of(data.subject),
        subject=data.entity(),
        time=time or utcnow(),
        data=data,
    )


def subject_of(event: CloudEvent, tenant: str | None = None) -> str:
    """The NATS subject `event` is published on: a job event's subject followed by its job's `tenant`
    (`job.placed.vision`; a `job.submitted` event names its tenant itself), any other event's subject as it is.
    ValueError for a job event without a valid tenant."""
    subject = event.nats_subject
    if subject not in JOB_SUBJECTS:
        return subject.value
    if tenant is None:
        tenant = getattr(event.data, "tenant", None)
        if tenant is None:
            raise ValueError(f"{subject} event {event.id}: its job's tenant is needed to publish it")
    return f"{subject.value}.{_checked(tenant)}"
