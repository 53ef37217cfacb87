"""Who may see and change which model: the one rule of the model routes, of deployments, and of a serve job
submitted through `POST /v1/jobs`.

A model belongs to a tenant, and its name is that tenant's. A tenant sees its own models and public ones; it
changes only its own (an admin: any). A model it may not see is answered as one that does not exist (404)."""

from __future__ import annotations

from fastapi import HTTPException, status

from gpuyard.services.submit.auth import may_see
from gpuyard.services.submit.context import SubmitContext
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.contracts.events.subjects import tenant_error
from gpuyard.shared.contracts.jobspec import ServeSpec
from gpuyard.shared.stores.readmodels.modelregistry import (
    ModelError,
    ModelRegistry,
    ModelVersion,
    ModelView,
    visible_to,
)

NAME_RULE = "lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 chars"


def registry_of(ctx: SubmitContext) -> ModelRegistry:
    if ctx.models is None:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, "no model store is configured")
    return ctx.models


def model_name(name: str) -> str:
    if tenant_error(name) is not None:  # the same rule as a tenant's (and a job's) name
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"model name {name!r}: use {NAME_RULE}")
    return name


def refused(exc: ModelError) -> HTTPException:
    return HTTPException(exc.status, str(exc), headers={"Retry-After": "2"} if exc.status == 503 else None)


async def visible_model(ctx: SubmitContext, principal: Principal, name: str, tenant: str | None) -> ModelView:
    """The listed model `name` of `tenant` (default: the caller's), if the caller may see it."""
    owner = tenant or principal.tenant
    view = await registry_of(ctx).get(owner, model_name(name)) if tenant_error(owner) is None else None
    if view is None or not visible_to(principal, view):
        where = f" of tenant {owner!r}" if tenant else ""
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"no model {name!r}{where}")
    return view


async def owned_model(ctx: SubmitContext, principal: Principal, name: str, tenant: str | None) -> ModelView:
    """`visible_model`, and the caller may change it: its tenant's, or an admin."""
    view = await visible_model(ctx, principal, name, tenant)
    if not may_see(principal, view.tenant):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"model {name!r} is tenant {view.tenant!r}'s: only it or an admin may change it",
        )
    return view


def listed_version(view: ModelView, version: int | None) -> ModelVersion:
    """`version` of the model (None: its newest), or 404."""
    held = view.find(version) if version is not None else view.latest
    if held is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"model {view.name!r} has no version {version}")
    return held


async def servable(ctx: SubmitContext, principal: Principal, serve: ServeSpec, job_tenant: str) -> None:
    """A serve job names a model version the caller may use (its tenant's, or a public one), or 422: what a
    spec given to `POST /v1/jobs` must do, as a deployment's (which checks it first, answering 404)."""
    try:
        listed_version(
            await visible_model(ctx, principal, serve.model, serve.tenant or job_tenant), serve.version
        )
    except HTTPException as exc:
        if exc.status_code != status.HTTP_404_NOT_FOUND:
            raise
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, f"serve: {exc.detail}") from None
