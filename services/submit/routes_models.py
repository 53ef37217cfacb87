"""/v1/models: publish, list, describe, share and delete models (docs/models.md).

A model belongs to a tenant, and its name is that tenant's: a route names another tenant's model with
`?tenant=`. A tenant sees its own models and public ones; it changes only its own (an admin: any). A model it
may not see is answered as one that does not exist (404).

`POST /v1/models` also takes a job's publish token (`shared.jobtokens`), which no other route accepts: the
model is the job's tenant's, and records the job that produced it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request, Response, status

from services.submit.auth import Context, CurrentPrincipal, _bearer, may_see
from services.submit.errors import answers
from shared.api import (
    ModelDeletedOut,
    ModelListOut,
    ModelOut,
    ModelPatch,
    ModelPublishedOut,
    ModelSummaryOut,
    ModelVersionOut,
)
from shared.events import tenant_error
from shared.jobspec import NAME_PATTERN
from shared.jobstate import ACTIVE_STATES
from shared.jobtokens import JobTokenError, is_job_token, read_secret, verify
from shared.modelregistry import ModelError, ModelRegistry, ModelVersion, ModelView
from shared.onnxsig import InvalidModel
from shared.tokens import Principal, TokenRefused

router = APIRouter(prefix="/v1/models", tags=["models"], responses=answers(400, 401, 413, 503))

NamePath = Annotated[str, Path(pattern=NAME_PATTERN, description="The model's name.")]
NAME_RULE = "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 chars"
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


def _registry(ctx) -> ModelRegistry:
    if ctx.models is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "no model store is configured")
    return ctx.models


def _name(name: str) -> str:
    if tenant_error(name) is not None:  # the same rule as a tenant's (and a job's) name
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, f"model name {name!r}: use {NAME_RULE}")
    return name


def _refused(exc: ModelError) -> HTTPException:
    return HTTPException(exc.status, str(exc), headers={"Retry-After": "2"} if exc.status == 503 else None)


async def _visible(ctx, principal: Principal, name: str, tenant: str | None) -> ModelView:
    """The listed model `name` of `tenant` (default: the caller's), if the caller may see it."""
    owner = tenant or principal.tenant
    view = await _registry(ctx).get(owner, _name(name)) if tenant_error(owner) is None else None
    if view is None or not view.versions or not (view.public or may_see(principal, view.tenant)):
        where = f" of tenant {owner!r}" if tenant else ""
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no model {name!r}{where}")
    return view


async def _owned(ctx, principal: Principal, name: str, tenant: str | None) -> ModelView:
    """`_visible`, and the caller may change it: its tenant's, or an admin."""
    view = await _visible(ctx, principal, name, tenant)
    if not may_see(principal, view.tenant):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"model {name!r} is tenant {view.tenant!r}'s: only it or an admin may change it",
        )
    return view


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


# ---------------------------------------------------------------- routes


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=ModelPublishedOut,
    responses={
        200: {"model": ModelPublishedOut, "description": "These bytes were published before (`duplicate`)."},
        **answers(403, 409),
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
) -> ModelPublishedOut:
    """Publish an ONNX file (the request body) as a new version of model `name`: `curl --data-binary
    @model.onnx -H 'Content-Type: application/octet-stream' '.../v1/models?name=resnet'`. Its signature is read
    from the graph; a file that is not a valid ONNX model is refused (422) with the reason. A version never
    changes: the same version with other bytes is 409; the same bytes again answer the version holding them
    (200, `duplicate`)."""
    principal = who.principal
    owner = tenant or principal.tenant
    if owner != principal.tenant and not principal.admin:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN, f"your token is for tenant {principal.tenant!r}, not {owner!r}"
        )
    if (bad := tenant_error(owner)) is not None:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_ENTITY, f"{bad} (the model's tenant)")
    registry = _registry(ctx)
    data = await request.body()
    try:
        done = await registry.publish(
            tenant=owner, name=name, data=data, version=version, public=public, job_id=who.job_id,
            user=principal.user,
        )  # fmt: skip
    except InvalidModel as exc:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_ENTITY, f"not a publishable ONNX model: {exc}"
        ) from None
    except ModelError as exc:
        raise _refused(exc) from None
    if done.duplicate:
        response.status_code = status.HTTP_200_OK
    return ModelPublishedOut(
        **version_out(done.version).model_dump(),
        name=done.view.name,
        tenant=done.view.tenant,
        public=done.view.public,
        duplicate=done.duplicate,
    )


@router.get(
    "",
    response_model=ModelListOut,
)
async def list_models(ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None) -> ModelListOut:
    """Your tenant's models and the public ones (an admin: every tenant's), by tenant then name; ?tenant=
    keeps one tenant's."""
    registry = _registry(ctx)
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
    return model_out(await _visible(ctx, principal, name, tenant))


@router.get("/{name}/versions/{version}", response_model=ModelVersionOut, responses=answers(404))
async def get_model_version(
    name: NamePath,
    version: VersionPath,
    ctx: Context,
    principal: CurrentPrincipal,
    tenant: OwnerQuery = None,
) -> ModelVersionOut:
    view = await _visible(ctx, principal, name, tenant)
    held = view.find(version)
    if held is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"model {name!r} has no version {version}")
    return version_out(held)


@router.patch("/{name}", response_model=ModelOut, responses=answers(403, 404))
async def change_model(
    name: NamePath, change: ModelPatch, ctx: Context, principal: CurrentPrincipal, tenant: OwnerQuery = None
) -> ModelOut:
    """Make a model public (every tenant may see and use it) or private again: its tenant or an admin."""
    view = await _owned(ctx, principal, name, tenant)
    try:
        changed = await _registry(ctx).set_public(view.tenant, view.name, change.public, principal.name)
    except ModelError as exc:
        raise _refused(exc) from None
    return model_out(changed)


async def _delete(ctx, principal: Principal, name: str, tenant: str | None, version: int | None):
    view = await _owned(ctx, principal, name, tenant)
    try:
        gone = await _registry(ctx).delete(view.tenant, view.name, version, principal.name)
    except ModelError as exc:
        raise _refused(exc) from None
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
