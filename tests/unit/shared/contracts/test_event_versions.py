"""Event data versions: the envelope names the version of its data (`dataversion`, absent = 1); events stored by
an older model are upgraded by the upcasters registered next to the model when read back, from a real SQLite
store; an event newer than the reader's model is refused, not misread."""

from __future__ import annotations

import json
import sqlite3

import pytest
from pydantic import Field, ValidationError

from gpuyard.shared.contracts.events import envelope as events
from gpuyard.shared.contracts.events.envelope import (
    CloudEvent,
    EventData,
    EventVersionError,
    event,
    make_event,
    missing_upcasters,
    upcast,
    upcaster,
)
from gpuyard.shared.contracts.events.jobs import JobPreempted
from gpuyard.shared.contracts.events.models import ModelPublished
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.jobstate import JobState, fold
from gpuyard.shared.contracts.stops import PreemptionCause, preemption_text
from gpuyard.shared.stores.events.sqlite import SqliteEventStore

# A job.submitted event exactly as the store held it before data versions existed (no `dataversion`).
STORED_BEFORE_VERSIONS = (
    '{"specversion":"1.0","id":"0f3c9a1e5b7d4c2a8e6f1b3d5c7a9e0f","source":"/gpuyard/submit/host-1",'
    '"type":"io.gpuyard.job.submitted","subject":"job-1","time":"2026-05-01T12:00:00Z",'
    '"datacontenttype":"application/json","data":{"job_id":"job-1","name":"resnet","tenant":"vision",'
    '"user":"ana","spec":{"name":"resnet","command":"python train.py","resources":{"gpus":1}}}}'
)


def insert_raw(path, stream_id: str, version: int, raw: str) -> None:
    """Put an event into the store's table as a writer of another release did."""
    doc = json.loads(raw)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO events (stream_id, version, event_id, type, data, recorded_at) VALUES (?,?,?,?,?,0)",
            (stream_id, version, doc["id"], doc["type"], raw),
        )


async def test_an_event_stored_before_versions_reads_back_as_version_1(tmp_path):
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        insert_raw(tmp_path / "events.db", "job-1", 1, STORED_BEFORE_VERSIONS)
        [stored] = await store.read_stream("job-1")
        [outbox] = await store.unpublished(older_than=0)
    finally:
        await store.close()
    assert stored.event.dataversion == 1 and outbox.id == stored.event.id
    view = fold([stored.event])
    assert view is not None and view.state == JobState.QUEUED and view.spec.command == "python train.py"


RESNET_3 = dict(name="resnet", version=3, tenant="vision", uri="s3://m/3.onnx", sha256="0" * 64, size_bytes=1)


def test_the_envelope_names_the_version_of_its_data():
    ev = make_event(ModelPublished(**RESNET_3), source="test")
    assert ev.dataversion == 1 and json.loads(ev.to_json())["dataversion"] == 1


def register_model_published_v2(monkeypatch) -> type[EventData]:
    """model.published at version 2: `uri` renamed to `location`, `framework` added; v1 events upgraded by
    the upcaster registered with it (through the real decorators, on copies of the registries)."""
    monkeypatch.setattr(events, "REGISTRY", {**events.REGISTRY})
    monkeypatch.setattr(events, "UPCASTERS", {**events.UPCASTERS})
    del events.REGISTRY[Subject.MODEL_PUBLISHED]

    @event(Subject.MODEL_PUBLISHED, version=2)
    class ModelPublishedV2(EventData):
        name: str
        version: int
        location: str = Field(..., description="Where the ONNX file is (was `uri` in version 1).")
        framework: str
        job_id: str | None = None

    @upcaster(Subject.MODEL_PUBLISHED, from_version=1)
    def _uri_becomes_location(data: dict) -> dict:
        data["location"] = data.pop("uri")
        data.setdefault("framework", "unknown")
        return data

    return ModelPublishedV2


async def test_an_event_stored_by_the_older_model_reads_back_upgraded(tmp_path, monkeypatch):
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        v1 = make_event(ModelPublished(**RESNET_3), source="test")
        await store.append("model-resnet", 0, [v1])  # written by the release whose model was version 1
        model_v2 = register_model_published_v2(monkeypatch)  # the release that reads it
        [stored] = await store.read_stream("model-resnet")
        [outbox] = await store.unpublished(older_than=0)
    finally:
        await store.close()
    data = stored.event.data
    assert isinstance(data, model_v2) and stored.event.dataversion == 2 and outbox.data == data
    assert (data.location, data.framework, data.name, data.version) == (
        "s3://m/3.onnx",
        "unknown",
        "resnet",
        3,
    )
    again = CloudEvent.from_json(stored.event.to_json())  # sent on as version 2: read without upcasting
    assert again.dataversion == 2 and again.data == data


def test_an_event_newer_than_the_reader_is_refused():
    doc = json.loads(STORED_BEFORE_VERSIONS) | {"dataversion": 2}
    with pytest.raises(
        ValidationError, match=r"data version 2 is newer than this reader's model \(version 1\)"
    ):
        CloudEvent.model_validate(doc)


async def test_the_store_refuses_a_newer_event_instead_of_misreading_it(tmp_path):
    path = tmp_path / "events.db"
    store = await SqliteEventStore.open(path)
    try:
        insert_raw(path, "job-1", 1, json.dumps(json.loads(STORED_BEFORE_VERSIONS) | {"dataversion": 7}))
        with pytest.raises(ValidationError, match="upgrade GPUYard"):
            await store.read_stream("job-1")
    finally:
        await store.close()


def test_a_version_without_its_upcaster_is_named(monkeypatch):
    monkeypatch.setattr(events, "REGISTRY", {**events.REGISTRY})
    monkeypatch.setattr(events, "UPCASTERS", {**events.UPCASTERS})
    del events.REGISTRY[Subject.ALERT_RESOLVED]
    event(Subject.ALERT_RESOLVED, version=3)(type("AlertResolvedV3", (EventData,), {"__annotations__": {}}))
    upcaster(Subject.ALERT_RESOLVED, from_version=1)(lambda data: data)
    assert missing_upcasters() == [(Subject.ALERT_RESOLVED, 2)]
    with pytest.raises(EventVersionError, match="no upcaster from data version 2 to 3"):
        upcast(Subject.ALERT_RESOLVED, {"alert_id": "a", "kind": "k"}, 1)


def test_every_model_of_this_release_reads_all_its_versions():
    assert missing_upcasters() == []
    assert all(model.schema_version >= 1 for model in events.REGISTRY.values())


def test_a_version_1_gpu_sample_reads_as_a_node_sample_of_one_gpu():
    raw = {
        "specversion": "1.0",
        "id": "s1",
        "source": "/monitor",
        "type": "io.gpuyard.gpu.sample",
        "subject": "node-1",
        "time": "2026-11-20T10:00:00Z",
        "data": {
            "node": "node-1",
            "index": 3,
            "uuid": "GPU-1",
            "model": "H100",
            "utilization_pct": 42.0,
            "memory_used_bytes": 10,
            "memory_total_bytes": 80,
            "temperature_c": 61.0,
            "simulated": True,
        },
    }
    sample = CloudEvent.model_validate(raw)
    assert sample.dataversion == 2
    assert sample.data.node == "node-1" and sample.data.simulated
    [gpu] = sample.data.gpus
    assert (gpu.index, gpu.uuid, gpu.utilization_pct, gpu.temperature_c) == (3, "GPU-1", 42.0, 61.0)


def preempted_v1(reason: str, event_id: str) -> str:
    """A job.preempted as version 1 wrote it: why in free text."""
    return json.dumps(
        {
            "specversion": "1.0",
            "id": event_id,
            "source": "/gpuyard/scheduler/host-1",
            "type": "io.gpuyard.job.preempted",
            "subject": "job-1",
            "time": "2026-05-01T12:01:00Z",
            "datacontenttype": "application/json",
            "data": {
                "job_id": "job-1",
                "attempt": 1,
                "reason": reason,
                "by_job": "job-9",
                "grace_seconds": 5,
            },
        }
    )


@pytest.mark.parametrize(
    ("reason", "cause", "node", "message"),
    [
        ("drain: node n1 is being drained", PreemptionCause.DRAIN, "n1", ""),
        ("priority", PreemptionCause.PRIORITY, None, ""),
        ("reclaim", PreemptionCause.RECLAIM, None, ""),
        ("an admin wanted it", PreemptionCause.OTHER, None, "an admin wanted it"),
    ],
)
async def test_a_version_1_preemption_reads_back_with_its_cause_and_node(
    tmp_path, reason, cause, node, message
):
    store = await SqliteEventStore.open(tmp_path / "events.db")
    try:
        insert_raw(tmp_path / "events.db", "job-1", 1, preempted_v1(reason, "p1"))
        [stored] = await store.read_stream("job-1")
    finally:
        await store.close()
    data = stored.event.data
    assert stored.event.dataversion == 2 and isinstance(data, JobPreempted)
    assert (data.cause, data.node, data.message, data.by_job, data.grace_seconds) == (
        cause,
        node,
        message,
        "job-9",
        5,
    )
    assert data.text == preemption_text(cause, node, message)
    if cause in (PreemptionCause.DRAIN, PreemptionCause.OTHER):
        assert data.text == reason  # the same words as before


def test_job_preempted_is_at_version_2_with_its_upcaster():
    assert JobPreempted.schema_version == 2 and (Subject.JOB_PREEMPTED, 1) in events.UPCASTERS
    upgraded = upcast(Subject.JOB_PREEMPTED, {"job_id": "j", "attempt": 1, "reason": "reclaim"}, 1)
    assert upgraded == {"job_id": "j", "attempt": 1, "cause": "reclaim", "node": None, "message": ""}
