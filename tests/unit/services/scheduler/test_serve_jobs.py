"""A serve job (one replica of a model deployment) is placed like any job: its GPU share is held, so a training
job is never placed onto GPU memory a model holds."""

from __future__ import annotations

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import fold
from gpuyard.shared.scheduling.inputs import job_request
from tests.unit.services.scheduler.builders import cluster, decide_snapshot, node, where


def request_of(job_id: str, spec: dict):
    """The scheduler's request for a job submitted with `spec`, as its view of the store makes it."""
    submitted = JobSubmitted(
        job_id=job_id, name=job_id, tenant="vision", user="ana", spec=JobSpec.model_validate(spec)
    )
    return job_request(fold([make_event(submitted, source="/test")]))


def test_a_serve_jobs_gpu_share_makes_an_over_allocating_training_job_wait():
    serve = request_of("serve", {"serve": {"model": "mnist", "version": 1}, "resources": {"gpus": 0.25}})
    assert serve.gpus == 0.25 and serve.replicas == 1
    state = cluster(node("n1", gpus=1))
    first = decide_snapshot(state, [serve])
    assert where(first, "serve") == [("n1", (0,))]
    training = request_of("train", {"command": "python train.py", "resources": {"gpus": 1}})
    second = decide_snapshot(state, [training])
    assert not second.placements  # the whole GPU is not there: a quarter of it serves mnist
    fits = request_of("small", {"command": "python train.py", "resources": {"gpus": 0.75}})
    assert where(decide_snapshot(state, [fits]), "small") == [("n1", (0,))]  # what is left of it is
