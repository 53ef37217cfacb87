"""The claims of the volumes that jobs mount, made and removed through the API server.

- `claim`, at a launch, before the pods: each volume's claim (and, with the NFS export set, its PersistentVolume,
  first) is created; one that exists already (a volume an earlier job mounted, a redelivered launch) is fine
  (409). A volume's size and creation come from the event store (`lookup`, the volume registry's `get`): one that
  is no longer there fails the start, and so does a refusal by the API server, with its message.
- `reconcile`, every few polls: the claims (and PersistentVolumes) this backend labelled whose volume is no
  longer in the store (deleted, or deleted and made again: a new claim) are deleted. Idempotent; a claim whose
  volume is there is never deleted, nor one without GPUYARD's annotations; a pod that still uses a claim keeps it
  until it ends (Kubernetes' pvc-protection).
- `sizes`, at a launch, where volumes live in the object store (`volumecopy.py`): no claim, only each volume's
  size (its copy's room in the pod), a volume no longer there failing the start as above.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC
from typing import Any

from gpuyard.services.executor.kubernetes import labels as job_labels
from gpuyard.services.executor.kubernetes.api import KubeAlreadyExists, KubeApi, KubeApiError
from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.volumeobjects import volume_objects
from gpuyard.shared.contracts.jobspec import VolumeMount
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeView

log = logging.getLogger(__name__)

VolumeLookup = Callable[[str, str], Awaitable[VolumeView | None]]
"""(tenant, name) → the volume, None when there is none (deleted)."""


class ClaimRefused(Exception):
    """A volume a job cannot be given; the message says why (the attempt fails to start with it)."""


def created_of(view: VolumeView) -> str:
    """What tells one volume from another of the same name made after it was deleted: its creation time, in UTC
    (a time without a zone is taken as UTC)."""
    at = view.created_at
    return (at.replace(tzinfo=UTC) if at.tzinfo is None else at.astimezone(UTC)).isoformat()


class VolumeClaims:
    def __init__(self, api: KubeApi, config: KubernetesConfig, lookup: VolumeLookup | None) -> None:
        self.api = api
        self.config = config
        self.lookup = lookup

    async def _view(self, tenant: str, name: str) -> VolumeView:
        """The volume as the event store has it. ClaimRefused when it cannot be found."""
        if self.lookup is None:
            raise ClaimRefused("this executor has no event store to find volumes in")
        view = await self.lookup(tenant, name)
        if view is None:
            raise ClaimRefused(f"volume {name} was deleted")
        return view

    async def sizes(self, tenant: str, volumes: Sequence[VolumeMount]) -> dict[str, int]:
        """Volume name → its size in bytes, for volumes copied from the object store. ClaimRefused."""
        return {mount.name: (await self._view(tenant, mount.name)).size_bytes for mount in volumes}

    async def claim(self, tenant: str, volumes: Sequence[VolumeMount]) -> dict[str, str]:
        """Volume name → its claim's name, each claim there once this returns. ClaimRefused with the reason."""
        claims: dict[str, str] = {}
        for mount in volumes:
            view = await self._view(tenant, mount.name)
            objects = volume_objects(
                tenant=tenant,
                volume=mount.name,
                size_bytes=view.size_bytes,
                created=created_of(view),
                config=self.config,
            )
            try:
                if objects.persistent_volume is not None:
                    with contextlib.suppress(KubeAlreadyExists):
                        await self.api.create_persistent_volume(objects.persistent_volume)
                with contextlib.suppress(KubeAlreadyExists):
                    await self.api.create_claim(self.config.namespace, objects.claim)
            except KubeApiError as exc:
                raise ClaimRefused(
                    f"Kubernetes refused the claim of volume {mount.name}: {exc.message}"
                ) from None
            claims[mount.name] = objects.claim_name
        return claims

    async def reconcile(self) -> list[str]:
        """Deletes the claims and PersistentVolumes of volumes gone from the store; the names deleted."""
        if self.lookup is None:
            return []
        namespace = self.config.namespace
        deleted: list[str] = []
        selector = job_labels.selector_string(job_labels.volume_selector())
        for claim in await self.api.list_claims(namespace, selector):
            name = claim["metadata"]["name"]
            if await self._orphaned(claim) and await self.api.delete_claim(namespace, name):
                deleted.append(name)
        if self.config.nfs_export is not None:
            selector = job_labels.selector_string(job_labels.volume_selector(namespace))
            for volume in await self.api.list_persistent_volumes(selector):
                name = volume["metadata"]["name"]
                if await self._orphaned(volume) and await self.api.delete_persistent_volume(name):
                    deleted.append(name)
        if deleted:
            log.info("deleted the claims of deleted volumes: %s", ", ".join(deleted))
        return deleted

    async def _orphaned(self, obj: dict[str, Any]) -> bool:
        """Whether `obj` (a claim or PersistentVolume) is of a volume no longer in the store."""
        annotations = obj["metadata"].get("annotations") or {}
        tenant = annotations.get(job_labels.TENANT_EXACT)
        volume = annotations.get(job_labels.VOLUME_EXACT)
        created = annotations.get(job_labels.VOLUME_CREATED)
        if not (tenant and volume and created):
            return False  # not one GPUYARD made whole: left alone
        assert self.lookup is not None
        view = await self.lookup(tenant, volume)
        return view is None or created_of(view) != created
