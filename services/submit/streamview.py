"""What a caller of the live event stream (`GET /v1/events/stream`) may see of an event: the same as the API's
reads show it. A tenant sees its own jobs' and models' events, and alerts about its own jobs (as GET
/v1/alerts); of a GPU sample, the GPUs of every node, with another tenant's holders blanked (as GET /v1/nodes
shows them: a share, never whose). An admin sees everything."""

from __future__ import annotations

from shared.events import AlertRaised, AlertResolved, CloudEvent, GpuSample, tenant_of_subject
from shared.tokens import Principal

ALERT_DATA = (AlertRaised, AlertResolved)


def seen_by(principal: Principal, event: CloudEvent, nats_subject: str) -> CloudEvent | None:
    """`event` as `principal` may see it, or None when it may not."""
    if principal.admin:
        return event
    data = event.data
    subject_tenant = tenant_of_subject(nats_subject)
    if subject_tenant is not None:
        return event if subject_tenant == principal.tenant else None  # a job's: its tenant's, as published
    if isinstance(data, GpuSample):
        return _blanked(principal, event, data)
    owner = getattr(data, "tenant", None)
    if isinstance(data, ALERT_DATA) or owner is not None:
        return event if owner == principal.tenant else None  # a model's or an alert's: its tenant's
    return event if getattr(data, "job_id", None) is None else None


def _blanked(principal: Principal, event: CloudEvent, sample: GpuSample) -> CloudEvent:
    if all(h.tenant == principal.tenant for g in sample.gpus for h in g.holders):
        return event
    gpus = [
        g.model_copy(
            update={
                "holders": [
                    h
                    if h.tenant == principal.tenant
                    else h.model_copy(update={"job_id": "", "tenant": "", "user": ""})
                    for h in g.holders
                ]
            }
        )
        for g in sample.gpus
    ]
    return event.model_copy(update={"data": sample.model_copy(update={"gpus": gpus})})
