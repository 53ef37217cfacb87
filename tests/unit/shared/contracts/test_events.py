import uuid

import pytest

from gpuyard.docsgen.events import EXAMPLES
from gpuyard.shared.contracts.events.envelope import (
    REGISTRY,
    CloudEvent,
    derived_id,
    make_event,
    subject_of_type,
    type_of,
)
from gpuyard.shared.contracts.events.subjects import Subject


def test_every_subject_has_exactly_one_model_and_an_example():
    assert set(REGISTRY) == set(Subject)
    assert set(EXAMPLES) == set(Subject)


def test_every_event_round_trips_through_cloudevents_json():
    for subject, data in EXAMPLES.items():
        event = make_event(data, source="/test")
        back = CloudEvent.from_json(event.to_json())
        assert back == event
        assert type(back.data) is REGISTRY[subject]
        assert back.nats_subject == subject
        assert back.specversion == "1.0" and back.type == "io.gpuyard." + subject.value


def test_type_and_subject_are_one_definition():
    for subject in Subject:
        assert subject_of_type(type_of(subject)) == subject


@pytest.mark.parametrize("parts", [("j", 1, "placed"), ("ü-job", 2, "exited", 0), (), ("a/b", None, 3.5)])
def test_derived_ids_are_uuid5_of_the_parts_as_ids_stored_earlier_were(parts):
    namespace = uuid.UUID("6c1f7d3e-41a5-4f0e-9a57-6f1d0c1b9a11")
    assert derived_id(*parts) == uuid.uuid5(namespace, "/".join(str(p) for p in parts)).hex


def test_derived_ids_are_deterministic_and_distinct():
    assert derived_id("j", 1, "placed") == derived_id("j", 1, "placed")
    assert derived_id("j", 1, "placed") != derived_id("j", 2, "placed")


def test_readers_tolerate_unknown_fields():
    raw = make_event(EXAMPLES[Subject.JOB_SUCCEEDED], source="/t").to_dict()
    raw["data"]["added_in_a_later_version"] = 1
    assert CloudEvent.model_validate(raw).data == EXAMPLES[Subject.JOB_SUCCEEDED]


def test_a_replica_says_where_its_session_runs():
    from pydantic import ValidationError

    from gpuyard.shared.contracts.events.envelope import make_event
    from gpuyard.shared.contracts.events.models import ExecutionProvider, ModelFailed, ModelReady

    ready = ModelReady(
        name="mnist", tenant="vision", version=2, job_id="j1", node="n1", endpoint="http://10.0.0.7:8000",
        provider="CUDAExecutionProvider", device=0,
    )  # fmt: skip
    back = CloudEvent.from_json(make_event(ready, source="/gpuyard/serving/n1").to_json())
    assert (
        back.data == ready and back.data.provider is ExecutionProvider.CUDA and back.subject == "vision/mnist"
    )
    with pytest.raises(ValidationError):
        ModelReady(**{**ready.model_dump(), "provider": "TensorrtExecutionProvider"})
    failed = ModelFailed(
        name="mnist", tenant="vision", version=3, job_id="j2", node="n1", reason="checksum_mismatch",
        message="not the published bytes",
    )  # fmt: skip
    assert CloudEvent.from_json(make_event(failed, source="/s").to_json()).data == failed
