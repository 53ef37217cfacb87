"""What the live event stream shows each caller (services/submit/streamview.py): the API's own rules."""

from __future__ import annotations

from gpuyard.services.submit.streamview import seen_by
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.events.alerts import AlertRaised
from gpuyard.shared.contracts.events.envelope import make_event, subject_of
from gpuyard.shared.contracts.events.jobs import JobPlaced
from gpuyard.shared.contracts.events.models import ModelReady
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading, GpuSample, NodeHeartbeat

VISION = Principal(tenant="vision", user="ana")
NLP = Principal(tenant="nlp", user="bo")
ADMIN = Principal(tenant="ops", admin=True)


def event_on(data, tenant=None):
    event = make_event(data, source="/test")
    return event, subject_of(event, tenant)


def seen(principal, data, tenant=None):
    event, subject = event_on(data, tenant)
    return seen_by(principal, event, subject)


def test_a_tenant_sees_its_own_jobs_events_only():
    placed = JobPlaced(job_id="j1", attempt=1, placements=[])
    assert seen(VISION, placed, tenant="vision") is not None
    assert seen(NLP, placed, tenant="vision") is None
    assert seen(ADMIN, placed, tenant="vision") is not None


def test_alerts_are_seen_by_the_tenant_of_their_job_and_node_alerts_by_admins():
    about_job = AlertRaised(alert_id="a1", kind="job_waiting", message="m", job_id="j1", tenant="vision")
    about_node = AlertRaised(alert_id="a2", kind="node_lost", message="m", node="n1")
    assert seen(VISION, about_job) is not None and seen(NLP, about_job) is None
    assert seen(VISION, about_node) is None and seen(ADMIN, about_node) is not None


def test_a_gpu_sample_blanks_other_tenants_holders():
    sample = GpuSample(
        node="n1",
        gpus=[
            GpuReading(
                index=0,
                uuid="GPU-0",
                utilization_pct=80,
                holders=[
                    GpuHolder(job_id="mine", tenant="vision", user="ana", fraction=0.5),
                    GpuHolder(job_id="theirs", tenant="nlp", user="bo", fraction=0.5),
                ],
            )
        ],
    )
    shown = seen(VISION, sample)
    holders = shown.data.gpus[0].holders
    assert [(h.job_id, h.tenant, h.user, h.fraction) for h in holders] == [
        ("mine", "vision", "ana", 0.5),
        ("", "", "", 0.5),
    ]
    assert shown.data.gpus[0].utilization_pct == 80
    assert b"theirs" not in shown.to_json() and b"nlp" not in shown.to_json()
    assert seen(ADMIN, sample).data.gpus[0].holders[1].job_id == "theirs"


def test_platform_events_without_a_tenant_are_seen_by_all_and_models_by_their_tenant():
    beat = NodeHeartbeat(node="n1", gpus=[], cpus=8, memory_bytes=1 << 30)
    assert seen(NLP, beat) is not None
    ready = ModelReady(
        name="m",
        version=1,
        tenant="vision",
        node="n1",
        replica=0,
        job_id="j",
        endpoint="e",
        provider="CPUExecutionProvider",
    )
    assert seen(VISION, ready) is not None and seen(NLP, ready) is None
