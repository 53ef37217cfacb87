"""Which store a platform's volumes live in (`GPUYARD_VOLUME_STORE`, docs/volumes.md): empty, folders of the
storage root (`volumefolders.py`); an fsspec URL, an object store (`volumeobjects.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

from gpuyard.services.submit.volumefiles import VolumeFiles
from gpuyard.services.submit.volumefolders import FolderVolumes
from gpuyard.services.submit.volumeobjects import ObjectVolumes
from gpuyard.shared.runtime.jobusers import JobUser, JobUsers, uid_key
from gpuyard.shared.runtime.storageroot import storage_root_of
from gpuyard.shared.settings.submit import SubmitSettings


def volume_files(store: str, root: Path, owner_of: Callable[[str], JobUser | None]) -> VolumeFiles:
    """The volumes' files: in `store` (`volume_store`) when set, else in folders of the storage root `root`.
    ObjectStoreError for a store URL that cannot be used."""
    if store:
        return ObjectVolumes(store, root, owner_of)
    return FolderVolumes(root, owner_of)


async def volume_files_of(settings: SubmitSettings) -> VolumeFiles:
    """The volumes' files in the store the settings name, each volume its tenant's jobs' user's (as the executor
    gives them)."""
    users = JobUsers.from_setting(settings.job_users, settings.job_uid_base)
    if users.derives:
        users.key, _ = await asyncio.to_thread(
            uid_key, settings.data_dir
        )  # (the executor says what it means)
    return volume_files(settings.volume_store, storage_root_of(settings), users.for_tenant)
