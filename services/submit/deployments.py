"""Model deployments (`/v1/models/{name}/deployments`): a deployment of N replicas is N serve jobs, queued
through `POST /v1/jobs`'s own path (`queue_job`: the same validation, quotas and queue limits), and undeploying
cancels them through the jobs' own cancel path. Their replicas are held by the serving service of the node
each is placed on (docs/architecture.md, "Model deployments").

Serve jobs belong to the tenant that deploys: its own model's, or, for another tenant's public model, its own
(its quota pays for them). An admin deploys a model for the tenant that owns it."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import HTTPException, status

from gpuyard.services.submit.auth import may_see
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.jobs import cancel, queue_job
from gpuyard.services.submit.modelaccess import listed_version
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.api.jobs import CancelOut, job_out
from gpuyard.shared.contracts.api.models import DeploymentAccepted, DeploymentIn, ReplicaOut, replica_out
from gpuyard.shared.contracts.jobspec import JobSpec, ServeSpec
from gpuyard.shared.contracts.jobstate import JobView
from gpuyard.shared.stores.readmodels.modelregistry import ModelView, live_serve_jobs

PAGE = 500


def deploying_tenant(principal: Principal, view: ModelView) -> str:
    """Whose serve jobs a deployment's are: the model's tenant when the caller may act for it, else the
    caller's (a public model of another tenant)."""
    return view.tenant if may_see(principal, view.tenant) else principal.tenant


def serve_spec(view: ModelView, version: int, job_tenant: str, asked: DeploymentIn) -> JobSpec:
    """The spec of one replica of the deployment `asked` for."""
    serve = ServeSpec(
        model=view.name, version=version, tenant=None if view.tenant == job_tenant else view.tenant
    )
    return JobSpec(
        tenant=job_tenant, serve=serve, resources=asked.resources(), priority=asked.priority, replicas=1
    )


async def deploy(
    ctx: SubmitContext,
    principal: Principal,
    view: ModelView,
    asked: DeploymentIn,
    idempotency_key: str | None = None,
) -> DeploymentAccepted:
    """Queue `asked.replicas` serve jobs of `asked.version` (default: the newest). With an Idempotency-Key,
    replica i's job is queued under `KEY/i`: a retry answers the same jobs. A tenant at its queue limit is
    refused (429) for what did not fit, and the replicas queued before are cancelled: all or nothing."""
    version = listed_version(view, asked.version).version
    spec = serve_spec(view, version, deploying_tenant(principal, view), asked)
    accepted = []
    try:
        for replica in range(asked.replicas):
            key = f"{idempotency_key}/{replica}" if idempotency_key else None
            accepted.append(await queue_job(ctx, principal, spec, key))
    except BaseException:
        for done in accepted:
            if not done.duplicate:
                await _cancel_quietly(ctx, principal, done.job_id)
        raise
    return DeploymentAccepted(name=view.name, tenant=view.tenant, version=version, jobs=accepted)


@dataclass(frozen=True)
class ModelName:
    """A model named by its tenant and name, whether or not it is listed (one deleted while deployed)."""

    tenant: str
    name: str


async def live_replicas(
    ctx: SubmitContext,
    principal: Principal,
    view: ModelView | ModelName,
    version: int | None = None,
    *,
    every_tenant: bool = False,
) -> list[JobView]:
    """The model's serve jobs not yet ended, newest first, of the tenants the caller may see (an admin: all;
    a tenant: its own, which is where a public model's other users' deployments stay hidden); `every_tenant`:
    whoever deployed it (what deleting a model must know).

    (`modelregistry.live_serve_jobs`, which deleting a deployed version consults too.)"""
    job_tenant = None if principal.admin or every_tenant else principal.tenant
    return await live_serve_jobs(ctx.store, view.tenant, view.name, version, job_tenant=job_tenant)


def replicas_out(jobs: list[JobView]) -> list[ReplicaOut]:
    return [replica_out(job_out(job)) for job in jobs]


async def undeploy(
    ctx: SubmitContext, principal: Principal, view: ModelView | ModelName, version: int | None
) -> list[CancelOut]:
    """Cancel the model's live serve jobs (of `version`, when given) that the caller may see: 404 when there
    are none."""
    jobs = await live_replicas(ctx, principal, view, version)
    if not jobs:
        what = f"{view.name}:{version}" if version is not None else view.name
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no deployment of {what} to undeploy")
    cancelled = []
    for job in jobs:
        if (done := await _cancel_quietly(ctx, principal, job.job_id)) is not None:
            cancelled.append(done)
    return cancelled


async def _cancel_quietly(ctx: SubmitContext, principal: Principal, job_id: str) -> CancelOut | None:
    """`cancel`, None for a job that ended meanwhile (409)."""
    try:
        return await cancel(ctx, principal, job_id)
    except HTTPException as exc:
        if exc.status_code != status.HTTP_409_CONFLICT:
            raise
        return None
