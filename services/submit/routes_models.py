"""/v1/models: publish, list, describe, share and delete models (docs/models.md).

A model belongs to a tenant, and its name is that tenant's: a route names another tenant's model with
`?tenant=`. A tenant sees its own models and public ones; it changes only its own (an admin: any). A model it
may not see is answered as one that does not exist (404).

`POST /v1/models` also takes a job's publish token (`shared.jobtokens`), which no other route accepts: the
model is the job's tenant's, and records the job that produced it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Header, HTTPException, Path, Query, Request, Response, status
from pydantic import ValidationError

from services.submit.auth import Context, CurrentPrincipal, _bearer
from services.submit.deployments import deploy, live_replicas, replicas_out, undeploy
from services.submit.errors import answers
from services.submit.modelaccess import owned_model, refused, registry_of, visible_model
from shared.api import (
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
from shared.events import tenant_error
from shared.jobspec import DEFAULT_PRIORITY, MAX_DEPLOYMENT_REPLICAS, NAME_PATTERN
from shared.jobstate import ACTIVE_STATES
from shared.jobtokens import JobTokenError, is_job_token, read_secret, verify
from shared.modelregistry import ModelError, ModelVersion, ModelView
from shared.onnxsig import InvalidModel
from shared.tokens import Principal, TokenRefused

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
INVALID = {
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


async def publisher(ctx: Context, token: Annotated[str | None, Depends(_bearer)]) -> Publisher:
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
        float | None, Query(ge=0, le=64, description="Each replica's GPUs; a share of one, e.g. 0.25.")
    ] = None,
    serve_replicas: Annotated[int | None, Query(ge=1, le=MAX_DEPLOYMENT_REPLICAS)] = None,
    serve_priority: Annotated[str | None, Query(description=f"Default: {DEFAULT_PRIORITY}.")] = None,
    serve_cpus: Annotated[float | None, Query(gt=0, le=1024)] = None,
    serve_memory: Annotated[str | None, Query(max_length=32, description="Host memory, e.g. 4GB.")] = None,
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
    except ValidationError as exc:
        reasons = "; ".join(
            f"serve_{'.'.join(map(str, e['loc'])) or 'serve'}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, reasons) from None


# ---------------------------------------------------------------- routes


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelPublishedOut,
    responses={
        200: {"model": ModelPublishedOut, "description": "These bytes were published before (`duplicate`)."},
        **answers(403, 409, 429),
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
    `POST /v1/models/{name}/deployments` would (`deployment` in the answer)."""
    principal = who.principal
    owner = tenant or principal.tenant
    if owner != principal.tenant and not principal.admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"your token is for tenant {principal.tenant!r}, not {owner!r}"
        )
    if (bad := tenant_error(owner)) is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"{bad} (the model's tenant)")
    registry = registry_of(ctx)
    data = await request.body()
    try:
        done = await registry.publish(
            tenant=owner, name=name, data=data, version=version, public=public, job_id=who.job_id,
            user=principal.user,
        )  # fmt: skip
    except InvalidModel as exc:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, f"not a publishable ONNX model: {exc}"
        ) from None
    except ModelError as exc:
        raise refused(exc) from None
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
        gone = await registry_of(ctx).delete(view.tenant, view.name, version, principal.name)
    except ModelError as exc:
        raise refused(exc) from None
    return ModelDeletedOut(name=view.name, tenant=view.tenant, versions=gone)


@router.delete("/{name}", response_model=ModelDeletedOut, responses=answers(403, 404, 409))
async def delete_model(
    name: NamePath, ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None
) -> ModelDeletedOut:
    """Remove every version of a model from the listing, and their files from the model store. A version
    number is never given again. (409 for a version a deployment serves, once deployments exist.)"""
    return await _delete(ctx, principal, name, tenant, None)


@router.delete("/{name}/versions/{version}", response_model=ModelDeletedOut, responses=answers(403, 404, 409))
async def delete_model_version(
    name: NamePath,
    version: VersionPath,
    ctx: Context,
    principal: CurrentPrincipal,
    tenant: OwnerQuery = None,
) -> ModelDeletedOut:
    """Remove one version from the listing, and its file from the model store."""
    return await _delete(ctx, principal, name, tenant, version)


# ---------------------------------------------------------------- deployments (serve jobs)


@router.post(
    "/{name}/deployments",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=DeploymentAccepted,
    responses=answers(403, 404, 409, 429),
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
    view = await visible_model(ctx, principal, name, tenant)
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
    view = await visible_model(ctx, principal, name, tenant)
    cancelled = await undeploy(ctx, principal, view, version)
    return UndeployedOut(name=view.name, tenant=view.tenant, cancelled=cancelled)
