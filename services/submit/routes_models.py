"""/v1/models: publish, list, describe, share and delete models (docs/models.md).

A model belongs to a tenant, and its name is that tenant's: a route names another tenant's model with
`?tenant=`. A tenant sees its own models and public ones; it changes only its own (an admin: any). A model it
may not see is answered as one that does not exist (404).

`POST /v1/models` also takes a job's publish token (`gpuyard.shared.auth.jobtokens`), which no other route accepts: the
model is the job's tenant's, and records the job that produced it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Path, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from gpuyard.services.submit.auth import Context, CurrentPrincipal, presented_token
from gpuyard.services.submit.bodywriter import write_body
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.deployments import (
    ModelName,
    deploy,
    live_replicas,
    replicas_out,
    undeploy,
)
from gpuyard.services.submit.errors import REFUSED_422, RETRY_AFTER, Responses, answers
from gpuyard.services.submit.modelaccess import owned_model, refused, registry_of, visible_model
from gpuyard.shared.auth.jobtokens import JobTokenError, is_job_token, read_secret, verify
from gpuyard.shared.auth.tokens import Principal, TokenRefused
from gpuyard.shared.contracts.api.common import ErrorOut
from gpuyard.shared.contracts.api.models import (
    DeploymentAccepted,
    DeploymentIn,
    DeploymentListOut,
    ModelDeletedOut,
    ModelListOut,
    ModelOut,
    ModelPatch,
    ModelPublishedOut,
    ModelSummaryOut,
    ModelVersionOut,
    UndeployedOut,
)
from gpuyard.shared.contracts.events.subjects import tenant_error
from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN, QUANTITY_MAX, SIZE_PATTERN
from gpuyard.shared.contracts.jobspec import (
    DEFAULT_PRIORITY,
    GPUS_SCHEMA,
    MAX_DEPLOYMENT_REPLICAS,
    MAX_GPUS_PER_REPLICA,
    Priority,
)
from gpuyard.shared.contracts.jobstate import ACTIVE_STATES
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.modelfiles.signature import CheckBounds, InvalidModel, Signature, check_file_async
from gpuyard.shared.modelfiles.store import ModelStore, ModelStoreError, StagedFile
from gpuyard.shared.stores.readmodels.modelregistry import ModelError, ModelVersion, ModelView

router = APIRouter(prefix="/v1/models", tags=["models"], responses=answers(400, 401, 413, 503))

NamePath = Annotated[str, Path(pattern=NAME_PATTERN, description="The model's name.")]
OwnerQuery = Annotated[
    str | None,
    Query(
        pattern=NAME_PATTERN,
        description="The tenant that owns the model (default: yours): another tenant's public model, or any "
        "for an admin.",
    ),
]
VersionPath = Annotated[int, Path(ge=1, le=2**31)]
INVALID: Responses = {
    422: {
        "description": "Invalid input: the fields refused, each with its reason, or a file that is not a "
        "publishable ONNX model, with the reason.",
        "content": {
            "application/json": {
                "schema": {
                    "anyOf": [
                        {"$ref": "#/components/schemas/HTTPValidationError"},
                        {"$ref": "#/components/schemas/ErrorOut"},
                    ]
                }
            }
        },
    }
}
ONNX_BODY = {
    "requestBody": {
        "required": True,
        "description": "The ONNX file, as it is (`Content-Type: application/octet-stream`).",
        "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
    }
}


def version_out(v: ModelVersion) -> ModelVersionOut:
    return ModelVersionOut.model_validate(v.model_dump())


def model_out(view: ModelView) -> ModelOut:
    return ModelOut(
        name=view.name,
        tenant=view.tenant,
        public=view.public,
        latest=view.latest.version if view.latest else None,
        versions=[version_out(v) for v in view.versions],
        created_at=view.created_at,
        updated_at=view.updated_at,
    )


# ---------------------------------------------------------------- who publishes


@dataclass(frozen=True)
class Publisher:
    principal: Principal
    job_id: str | None = None


async def publisher(ctx: Context, token: Annotated[str | None, Depends(presented_token)]) -> Publisher:
    """A bearer token, or a job's publish token: then the job must still run the attempt it was given to."""

    def refused(why: str) -> HTTPException:
        return HTTPException(status.HTTP_401_UNAUTHORIZED, why, headers={"WWW-Authenticate": "Bearer"})

    if token is None:
        raise refused("missing bearer token: send 'Authorization: Bearer <token>'")
    if not is_job_token(token):
        try:
            return Publisher(ctx.tokens.authenticate(token))
        except TokenRefused as exc:
            raise refused(str(exc)) from None
    if ctx.publish_secret_file is None:
        raise refused("this platform gives jobs no publish tokens")
    try:
        claims = verify(read_secret(ctx.publish_secret_file), token)
    except JobTokenError as exc:
        raise refused(str(exc)) from None
    doc = await ctx.store.get_projection(claims.job_id)
    if (
        doc is None
        or doc.get("tenant") != claims.tenant
        or doc.get("attempt") != claims.attempt
        or doc.get("state") not in {s.value for s in ACTIVE_STATES}
    ):
        raise refused(
            f"job {claims.job_id} attempt {claims.attempt} is not running: its publish token is void"
        )
    return Publisher(Principal(tenant=claims.tenant), job_id=claims.job_id)


def serve_query(
    serve: Annotated[
        bool, Query(description="Also deploy the version published (with the serve_* below, or defaults).")
    ] = False,
    serve_gpus: Annotated[
        float | None,
        Query(
            ge=0,
            le=MAX_GPUS_PER_REPLICA,
            description="Each replica's GPUs: whole ones, or a share of one (0.01 to 1), e.g. 0.25.",
            json_schema_extra=GPUS_SCHEMA,
        ),
    ] = None,
    serve_replicas: Annotated[int | None, Query(ge=1, le=MAX_DEPLOYMENT_REPLICAS)] = None,
    serve_priority: Annotated[Priority | None, Query(description=f"Default: {DEFAULT_PRIORITY}.")] = None,
    serve_cpus: Annotated[float | None, Query(gt=0, le=1024)] = None,
    serve_memory: Annotated[
        str | None,
        Query(pattern=SIZE_PATTERN, max_length=QUANTITY_MAX, description="Host memory, e.g. 4GB."),
    ] = None,
) -> DeploymentIn | None:
    """The deployment `POST /v1/models` asks for with its publication ("`serve:` in the publishing call"), or
    None: the same fields and rules as a deployment's body, as query parameters (the body is the ONNX file)."""
    given = {
        "gpus": serve_gpus,
        "replicas": serve_replicas,
        "priority": serve_priority,
        "cpus": serve_cpus,
        "memory": serve_memory,
    }
    given = {k: v for k, v in given.items() if v is not None}
    if not serve and not given:
        return None
    try:
        return DeploymentIn.model_validate(given)
    except ValidationError as exc:  # (as FastAPI says a query parameter refused: each with its place)
        raise RequestValidationError(
            [
                {**e, "loc": ["query", *([f"serve_{e['loc'][0]}"] if e["loc"] else ["serve"])]}
                for e in exc.errors(include_url=False, include_context=False)
            ]
        ) from None


# ---------------------------------------------------------------- routes


UPLOADS_FULL: Responses = {
    429: {
        "model": ErrorOut,
        "description": "The tenant has as many model uploads in progress as it may (`max_uploads_per_tenant`), "
        "or as many jobs queued (with `serve`): retry after Retry-After.",
        "headers": RETRY_AFTER,
    }
}
UPLOAD_RETRY_AFTER = 10
"""Seconds a tenant at its uploads limit is asked to wait (an upload takes seconds to minutes)."""


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelPublishedOut,
    response_model_exclude={"uri"},  # (where the server keeps the file is none of the publisher's business)
    responses={
        200: {"model": ModelPublishedOut, "description": "These bytes were published before (`duplicate`)."},
        **answers(403, 409),
        **UPLOADS_FULL,
        **INVALID,
    },
    openapi_extra=ONNX_BODY,
)
async def publish_model(
    request: Request,
    response: Response,
    ctx: Context,
    who: Annotated[Publisher, Depends(publisher)],
    name: Annotated[str, Query(pattern=NAME_PATTERN, description="The model's name (its tenant's).")],
    version: Annotated[
        int | None, Query(ge=1, le=2**31, description="The version to publish as (default: the next one).")
    ] = None,
    public: Annotated[bool, Query(description="Every tenant may see and use it.")] = False,
    tenant: Annotated[
        str | None, Query(pattern=NAME_PATTERN, description="Publish for this tenant (admins only).")
    ] = None,
    serve: Annotated[DeploymentIn | None, Depends(serve_query)] = None,
) -> ModelPublishedOut:
    """Publish an ONNX file (the request body) as a new version of model `name`: `curl --data-binary
    @model.onnx -H 'Content-Type: application/octet-stream' '.../v1/models?name=resnet'`. Its signature is read
    from the graph; a file that is not a valid ONNX model is refused (422) with the reason. A version never
    changes: the same version with other bytes is 409; the same bytes again answer the version holding them
    (200, `duplicate`). With `serve=true` (or any `serve_*`), the version published is also deployed, as
    `POST /v1/models/{name}/deployments` would (`deployment` in the answer).

    The caller is authenticated, and the request checked, before its body is read; the file is then written
    to disk as it comes (up to `max_model_bytes`) and checked in a process of its own, bounded in time and
    memory. A tenant may have `max_uploads_per_tenant` uploads in progress (429 beyond)."""
    principal = who.principal
    owner = tenant or principal.tenant
    if owner != principal.tenant and not principal.admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"your token is for tenant {principal.tenant!r}, not {owner!r}"
        )
    if (bad := tenant_error(owner)) is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"{bad} (the model's tenant)")
    registry = registry_of(ctx)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > ctx.max_model_bytes:
        raise too_large(ctx.max_model_bytes)
    if not ctx.uploads.take(principal.tenant):
        raise HTTPException(
            status.HTTP_429_TOO_MANY_REQUESTS,
            f"tenant {principal.tenant!r} has {ctx.uploads.limit} model uploads in progress, as many as it may "
            "(max_uploads_per_tenant): retry when one has ended",
            headers={"Retry-After": str(UPLOAD_RETRY_AFTER)},
        )
    try:
        staged = await receive_file(request, registry.files, ctx.max_model_bytes)
        try:
            staged.signature = await checked(staged, ctx.model_check)
            done = await registry.publish(
                tenant=owner, name=name, data=staged, version=version, public=public, job_id=who.job_id,
                user=principal.user,
            )  # fmt: skip
        except ModelError as exc:
            raise refused(exc) from None
        finally:
            staged.remove()
    finally:
        ctx.uploads.give_back(principal.tenant)
    if done.duplicate:
        response.status_code = status.HTTP_200_OK
    deployment = None
    if serve is not None:
        asked = serve.model_copy(update={"version": done.version.version})
        once = f"publish-and-serve:{done.view.tenant}/{done.view.name}:{done.version.version}"
        deployment = await deploy(
            ctx, principal, done.view, asked, once
        )  # (a retried publish: the same jobs)
    return ModelPublishedOut(
        **version_out(done.version).model_dump(),
        name=done.view.name,
        tenant=done.view.tenant,
        public=done.view.public,
        duplicate=done.duplicate,
        deployment=deployment,
    )


def too_large(limit: int) -> HTTPException:
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE, f"the model's file is over {format_size(limit)} (max_model_bytes)"
    )


async def receive_file(request: Request, files: ModelStore, limit: int) -> StagedFile:
    """The request's body written to a staged file as it comes (`ModelStore.stage`), at most `limit` bytes
    (413 beyond, the file removed), through `write_body`: each batch hashed and written from a thread."""
    try:
        staging = await asyncio.to_thread(files.stage)
    except ModelStoreError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, str(exc), headers={"Retry-After": "2"}
        ) from None
    try:
        await write_body(request.stream(), staging.write, limit=limit, over_limit=lambda: too_large(limit))
        staged = await asyncio.to_thread(staging.finish)
    except ClientDisconnect:
        staging.discard()
        raise HTTPException(status.HTTP_400_BAD_REQUEST, "the upload ended before its last byte") from None
    except OSError as exc:
        staging.discard()
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"cannot write the upload: {exc.strerror or exc}",
            headers={"Retry-After": "2"},
        ) from None
    except BaseException:
        staging.discard()
        raise
    if not staged.size:
        staged.remove()
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, "not a publishable ONNX model: the file is empty"
        )
    return staged


async def checked(staged: StagedFile, bounds: CheckBounds) -> Signature:
    """The signature of the staged file, read and checked in a process of its own (`onnxsig.check_file`): the
    event loop goes on answering meanwhile. 422 for a file that is not a publishable model, or whose check
    goes past a bound; 503 when no check can be run."""
    try:
        return await check_file_async(staged.path, bounds)
    except InvalidModel as exc:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, f"not a publishable ONNX model: {exc}"
        ) from None
    except OSError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE,
            f"cannot check the model now: {exc.strerror or exc}",
            headers={"Retry-After": "2"},
        ) from None


@router.get(
    "",
    response_model=ModelListOut,
)
async def list_models(ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None) -> ModelListOut:
    """Your tenant's models and the public ones (an admin: every tenant's), by tenant then name; ?tenant=
    keeps one tenant's."""
    registry = registry_of(ctx)
    if principal.admin:
        views = await registry.listed(tenant=tenant)
    else:
        views = (
            [] if tenant not in (None, principal.tenant) else await registry.listed(tenant=principal.tenant)
        )
        views += [
            v for v in await registry.listed(tenant=tenant, public=True) if v.tenant != principal.tenant
        ]
    return ModelListOut(
        items=[
            ModelSummaryOut(
                name=v.name,
                tenant=v.tenant,
                public=v.public,
                latest=v.latest.version if v.latest else None,
                versions=len(v.versions),
                updated_at=v.updated_at,
            )
            for v in sorted(views, key=lambda v: (v.tenant, v.name))
        ]
    )


@router.get("/{name}", response_model=ModelOut, responses=answers(404))
async def get_model(
    name: NamePath, ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None
) -> ModelOut:
    """A model and its versions, each with its signature, sha256, file and producing job."""
    return model_out(await visible_model(ctx, principal, name, tenant))


@router.get("/{name}/versions/{version}", response_model=ModelVersionOut, responses=answers(404))
async def get_model_version(
    name: NamePath,
    version: VersionPath,
    ctx: Context,
    principal: CurrentPrincipal,
    tenant: OwnerQuery = None,
) -> ModelVersionOut:
    view = await visible_model(ctx, principal, name, tenant)
    held = view.find(version)
    if held is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"model {name!r} has no version {version}")
    return version_out(held)


@router.patch("/{name}", response_model=ModelOut, responses=answers(403, 404))
async def change_model(
    name: NamePath, change: ModelPatch, ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None
) -> ModelOut:
    """Make a model public (every tenant may see and use it) or private again: its tenant or an admin."""
    view = await owned_model(ctx, principal, name, tenant)
    try:
        changed = await registry_of(ctx).set_public(view.tenant, view.name, change.public, principal.name)
    except ModelError as exc:
        raise refused(exc) from None
    return model_out(changed)


async def _delete(ctx, principal: Principal, name: str, tenant: str | None, version: int | None):
    view = await owned_model(ctx, principal, name, tenant)
    try:
        gone = await registry_of(ctx).delete(
            view.tenant, view.name, version, principal.name, viewer=principal
        )
    except ModelError as exc:
        raise refused(exc) from None
    return ModelDeletedOut(name=view.name, tenant=view.tenant, versions=gone)


@router.delete("/{name}", response_model=ModelDeletedOut, responses=answers(403, 404, 409))
async def delete_model(
    name: NamePath, ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None
) -> ModelDeletedOut:
    """Remove every version of a model from the listing, and their files from the model store. A version
    number is never given again. 409 while a deployment serves one of them (undeploy it first)."""
    return await _delete(ctx, principal, name, tenant, None)


@router.delete("/{name}/versions/{version}", response_model=ModelDeletedOut, responses=answers(403, 404, 409))
async def delete_model_version(
    name: NamePath,
    version: VersionPath,
    ctx: Context,
    principal: CurrentPrincipal,
    tenant: OwnerQuery = None,
) -> ModelDeletedOut:
    """Remove one version from the listing, and its file from the model store; 409 while a deployment
    serves it (undeploy it first)."""
    return await _delete(ctx, principal, name, tenant, version)


# ---------------------------------------------------------------- deployments (serve jobs)


@router.post(
    "/{name}/deployments",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DeploymentAccepted,
    responses=answers(403, 404, 409, 429) | REFUSED_422,  # (its jobs' 422s: `queue_job`'s)
)
async def deploy_model(
    name: NamePath,
    ctx: Context,
    principal: CurrentPrincipal,
    asked: Annotated[DeploymentIn, Body()] = DeploymentIn(),
    tenant: OwnerQuery = None,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> DeploymentAccepted:
    """Deploy a version of a model (default: its newest): one serve job per replica, each with `gpus` (a
    share of one GPU, e.g. 0.25, or whole ones), queued as `POST /v1/jobs` queues a job (the same quotas,
    queue limit, priorities and pending reasons) and named `NAME:VERSION`. A tenant deploys its own models and
    public ones. With an `Idempotency-Key`, a retry answers the same jobs."""
    view = await visible_model(ctx, principal, name, tenant)
    return await deploy(ctx, principal, view, asked, idempotency_key)


@router.get("/{name}/deployments", response_model=DeploymentListOut, responses=answers(404))
async def list_deployments(
    name: NamePath,
    ctx: Context,
    principal: CurrentPrincipal,
    tenant: OwnerQuery = None,
    version: Annotated[int | None, Query(ge=1, le=2**31, description="Only this version's.")] = None,
) -> DeploymentListOut:
    """The model's replicas not yet ended (its serve jobs: your tenant's; an admin: every tenant's), each with
    its version, state, node, GPU share and, while it waits, why."""
    view = await deployed_model(ctx, principal, name, tenant)
    jobs = await live_replicas(ctx, principal, view, version)
    return DeploymentListOut(name=view.name, tenant=view.tenant, replicas=replicas_out(jobs))


@router.delete("/{name}/deployments", response_model=UndeployedOut, responses=answers(404, 409))
async def undeploy_model(
    name: NamePath,
    ctx: Context,
    principal: CurrentPrincipal,
    tenant: OwnerQuery = None,
    version: Annotated[int | None, Query(ge=1, le=2**31, description="Only this version's.")] = None,
) -> UndeployedOut:
    """Undeploy: cancel the model's serve jobs (of `version`, when given) as `POST /v1/jobs/{id}/cancel`
    does; their GPUs are free once each has stopped. 404 when none is live."""
    view = await deployed_model(ctx, principal, name, tenant)
    cancelled = await undeploy(ctx, principal, view, version)
    return UndeployedOut(name=view.name, tenant=view.tenant, cancelled=cancelled)


async def deployed_model(
    ctx: SubmitContext, principal: Principal, name: str, tenant: str | None
) -> ModelView | ModelName:
    """The model a deployment route names: a listed one the caller may see, or one no longer listed whose
    replicas of the caller's (or, for an admin, anyone's) still run (deleted while deployed, before such a
    deletion was refused): they can still be listed and undeployed. 404 otherwise."""
    try:
        return await visible_model(ctx, principal, name, tenant)
    except HTTPException as exc:
        owner = tenant or principal.tenant
        if exc.status_code != status.HTTP_404_NOT_FOUND or tenant_error(owner) is not None:
            raise
        gone = ModelName(tenant=owner, name=name)
        if not await live_replicas(ctx, principal, gone):
            raise
        return gone
