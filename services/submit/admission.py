"""What `POST /v1/jobs` checks of a spec before it stores anything, its validation aside (`checked`): the
route, its fast path and `POST /v1/jobs/validate` ask it alike."""

from __future__ import annotations

from fastapi import HTTPException, status

from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.modelaccess import servable
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.api.jobs import SpecCheckOut
from gpuyard.shared.contracts.events.subjects import tenant_error
from gpuyard.shared.contracts.jobspec import MAX_GPUS_PER_REPLICA, JobSpec, start_error


def job_tenant(principal: Principal, spec: JobSpec) -> str:
    """The job's tenant: the spec's, or the caller's. 403: another tenant's without an admin's token; 422: one
    its events cannot name."""
    tenant = spec.tenant or principal.tenant
    if tenant != principal.tenant and not principal.admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"your token is for tenant {principal.tenant!r}, not {tenant!r}"
        )
    if (
        bad_tenant := tenant_error(tenant)
    ) is not None:  # the token's tenant: its job events could not be sent
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"{bad_tenant} (the job's tenant)")
    return tenant


def placeable(ctx: SubmitContext, spec: JobSpec) -> str | None:
    """Why no node heard from could ever hold the job (None: one could, or no node is heard from yet). 422 when
    none could, unless GPUYARD_ACCEPT_UNPLACEABLE; always past MAX_GPUS_PER_REPLICA GPUs a replica."""
    why = ctx.placeability.why_not(spec)
    if spec.resources.gpus > MAX_GPUS_PER_REPLICA:  # the schema's bound, said with the cluster's own size
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"no node could ever hold this job: {why}"
            if why
            else f"needs {spec.resources.gpus:g} GPUs on one node; a replica may have at most "
            f"{MAX_GPUS_PER_REPLICA}",
        )
    if why and not ctx.accept_unplaceable:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            f"no node could ever hold this job: {why} (GPUYARD_ACCEPT_UNPLACEABLE=true queues such jobs)",
        )
    return why


async def checked(ctx: SubmitContext, principal: Principal, spec: JobSpec) -> tuple[str, str | None]:
    """The checks in order: the tenant's (`job_tenant`), that its command and environment fit a replica's start
    (422, `gpuyard.shared.contracts.jobspec.start_error`), that some node could ever hold it (`placeable`), a
    serve job's model (422), its volumes (404). Returns the job's tenant and why no node could hold it (None: one could, or no
    node is heard from yet)."""
    tenant = job_tenant(principal, spec)
    if (too_large := start_error(spec)) is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, too_large)
    if (other_backend := ctx.placeability.backend_error(spec)) is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, other_backend)
    why = placeable(ctx, spec)
    if spec.serve is not None:
        await servable(ctx, principal, spec.serve, tenant)
    await mountable(ctx, spec, tenant)
    return tenant, why


async def mountable(ctx: SubmitContext, spec: JobSpec, tenant: str) -> None:
    """404 for a volume the job's tenant does not have (another tenant's is none of its own: never mounted); 422
    for a volume in an object store mounted read-write (jobs get a read-only copy of it)."""
    for mount in spec.volumes:
        if ctx.volumes is None or await ctx.volumes.get(tenant, mount.name) is None:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND,
                f"no volume {mount.name!r} of tenant {tenant!r} to mount (gpuyard volumes ls lists them)",
            )
        if not mount.read_only and ctx.volume_files is not None and ctx.volume_files.in_object_store:
            raise HTTPException(
                status.HTTP_422_UNPROCESSABLE_CONTENT,
                f"volume {mount.name!r} lives in an object store: mount it read_only, write results to "
                "GPUYARD_OUTPUT_DIR",
            )


async def spec_check(ctx: SubmitContext, principal: Principal, spec: JobSpec) -> SpecCheckOut:
    """What `POST /v1/jobs/validate` answers: the spec as it would be stored, whether a node heard from could
    ever hold it, and what a submit would do with it now (`checked`'s 403 or 422 raised as the submit's)."""
    tenant, why = await checked(ctx, principal, spec)
    if why:
        message = f"no node could ever hold it: {why}; it would be queued for a cluster that grows"
    elif not ctx.telemetry.live_nodes():
        message = "valid; no node is heard from yet, so whether one could hold it is not known"
    else:
        message = "valid; POST /v1/jobs would queue it"
    if (limit := ctx.queue.limit_of(tenant)) and ctx.queue.queued(tenant) >= limit:
        retry = ctx.queue.full(tenant).retry_after
        message += (
            f"; but tenant {tenant!r} has {limit} jobs waiting, its limit: a submit now gets 429"
            f" (retry in {retry} s)"
        )
    return SpecCheckOut(valid=True, spec=spec, tenant=tenant, placeable=why is None, message=message)
