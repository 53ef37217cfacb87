"""A dev environment's notebook folder, kept per tenant and user (docs/dev.md): the user's own volume
`dev-<user>`, made at their first `gpuyard dev start` and mounted at the environment's notebook root by every
one after, so that notebooks outlive a stop, a preemption and a restart. None where the platform has no volumes,
or keeps them in an object store (mounted read-only there): the notebooks then live in the job's own folder."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re

from fastapi import HTTPException, status

from gpuyard.services.submit.context import SubmitContext
from gpuyard.shared.auth.tokens import Principal
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeError

log = logging.getLogger(__name__)
PREFIX = "dev-"
NAME_MOST = 63


def home_volume_name(principal: Principal) -> str:
    """`dev-<user>`: the user's name (else the tenant's) as a volume's name takes it (lowercase letters, digits,
    '-'); a name changed to fit gets a short hash of the original, so two users never share one."""
    who = principal.name
    slug = re.sub(r"[^a-z0-9-]+", "-", who.lower()).strip("-") or "user"
    if slug != who:
        slug = f"{slug[:40].strip('-')}-{hashlib.sha256(who.encode()).hexdigest()[:6]}"
    return f"{PREFIX}{slug}"[:NAME_MOST].rstrip("-")


async def home_volume(ctx: SubmitContext, principal: Principal, tenant: str) -> str | None:
    """The caller's notebook volume in `tenant`, made when it has none yet; None without volumes (or in an
    object store). 422 past the tenant's volume quota, 503 when its folder cannot be made."""
    registry, files = ctx.volumes, ctx.volume_files
    if registry is None or files is None or files.in_object_store:
        return None
    name = home_volume_name(principal)
    if await registry.get(tenant, name) is not None:
        return name
    try:
        await asyncio.to_thread(files.make, tenant, name)
    except OSError as exc:
        raise HTTPException(
            status.HTTP_503_SERVICE_UNAVAILABLE, f"cannot make the notebook volume: {exc.strerror or exc}"
        ) from None
    try:
        await registry.create(
            tenant, name, ctx.volume_default_size, ctx.volume_quota_of(tenant), principal.user
        )
    except VolumeError as exc:
        if exc.status == status.HTTP_409_CONFLICT:  # another start made it meanwhile
            return name
        await asyncio.to_thread(files.remove, tenant, name)
        raise HTTPException(exc.status, f"the notebook volume {name!r}: {exc}") from None
    log.info("made the notebook volume %s of tenant %s for %s", name, tenant, principal.name)
    return name
