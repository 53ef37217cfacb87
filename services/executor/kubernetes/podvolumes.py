"""What a job pod mounts, and the variables that say where: a pure function, no API calls.

- its volumes (`volumes:` in the spec): each volume's claim (`volumeobjects.py`, made before the pods) at the
  job's path, read-only when asked (the kubelet mounts it so: a write fails with "Read-only file system"); a
  relative path is under the job's working directory, which is `KubernetesConfig.volume_working_dir`
  (`/workspace`) unless the spec names an absolute one. Each replica finds the place in `GPUYARD_VOLUME_<NAME>`
  (the local backend's name for it, `volumemounts.env_name`). A volume kept in the object store has no claim:
  the pod copies it into an emptyDir first and mounts the copy read-only (`volumecopy.py`).
- its checkpoint and output folders, with the storage root's NFS export set: the export, inline, mounted twice
  by subPath, its `checkpoints/<tenant>/<job id>` at `/gpuyard/checkpoints` and its `outputs/<tenant>/<job id>`
  at `/gpuyard/outputs` (the local backend's layout under the storage root, `paths.job_storage`), named in
  GPUYARD_CHECKPOINT_DIR and GPUYARD_OUTPUT_DIR. The kubelet makes a subPath's folders when they are not there.
  Without the export: neither, and the attempt's `job.started` says so (`NO_STORAGE_NOTE`).
- a memory-backed /dev/shm when `shm_size` is set.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from gpuyard.services.executor.jobenv import storage_env
from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.volumecopy import CopiedVolumes, copies_volume, copy_mount
from gpuyard.services.executor.volumemounts import env_name
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.runtime.paths import JobStorage, job_storage

SHM_VOLUME = "dshm"
STORAGE_VOLUME = "gpuyard-storage"
CHECKPOINT_MOUNT = "/gpuyard/checkpoints"
OUTPUT_MOUNT = "/gpuyard/outputs"
NO_STORAGE_NOTE = "no checkpoint or output folder on this backend: set volume_nfs_server and volume_nfs_path"


@dataclass(frozen=True)
class PodVolumes:
    volumes: list[dict[str, Any]] = field(default_factory=list)
    """The pod's `volumes`."""
    mounts: list[dict[str, Any]] = field(default_factory=list)
    """The container's `volumeMounts`."""
    env: dict[str, str] = field(default_factory=dict)
    working_dir: str | None = None
    """The container's workingDir, when its volumes need one the spec does not give."""
    copied: CopiedVolumes | None = None
    """The volumes the pod copies from the object store before the job starts (its init container)."""


def volume_name(index: int) -> str:
    """The pod's name for the `index`-th volume of the spec (a volume's own name may be 63 characters long)."""
    return f"volume-{index}"


def storage_subpaths(tenant: str, job_id: str) -> JobStorage:
    """The job's checkpoint and output folders relative to the storage root (the local backend's layout)."""
    storage = job_storage(".", tenant, job_id)
    return JobStorage(str(PurePosixPath(storage.checkpoints)), str(PurePosixPath(storage.outputs)))


def mount_places(spec: JobSpec, config: KubernetesConfig) -> tuple[dict[str, str], str | None]:
    """Volume name → where the pod sees it, and the workingDir to give the container (None: the spec's own)."""
    relative = [v for v in spec.volumes if not posixpath.isabs(v.path)]
    working_dir = spec.working_dir or ""
    base, set_dir = working_dir, None
    if relative and not posixpath.isabs(working_dir):
        base = set_dir = posixpath.normpath(posixpath.join(config.volume_working_dir, working_dir))
    places = {
        v.name: v.path if posixpath.isabs(v.path) else posixpath.join(base, v.path) for v in spec.volumes
    }
    return places, set_dir


def pod_volumes(
    *,
    spec: JobSpec,
    tenant: str,
    job_id: str,
    claims: Mapping[str, str],
    config: KubernetesConfig,
    copied: CopiedVolumes | None = None,
) -> PodVolumes:
    """What every replica's pod of the job mounts; `claims`: volume name → its claim's name; `copied`: the
    volumes copied from the object store instead."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    env: dict[str, str] = {}
    if config.shm_size:
        volumes.append(
            {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": str(config.shm_size)}}
        )
        mounts.append({"name": SHM_VOLUME, "mountPath": "/dev/shm"})
    places, working_dir = mount_places(spec, config)
    copies = copied if copied is not None and copied.sizes else None
    if copies is not None:
        volumes.append(copies_volume(copies))
    for index, volume in enumerate(spec.volumes):
        if copies is not None and volume.name in copies.sizes:
            mounts.append(copy_mount(tenant, volume.name, places[volume.name]))
            env[env_name(volume.name)] = places[volume.name]
            continue
        if volume.name not in claims:
            raise ValueError(f"no claim for volume {volume.name!r} of job {job_id}")
        name = volume_name(index)
        claim = {"claimName": claims[volume.name], "readOnly": volume.read_only}
        volumes.append({"name": name, "persistentVolumeClaim": claim})
        mounts.append({"name": name, "mountPath": places[volume.name], "readOnly": volume.read_only})
        env[env_name(volume.name)] = places[volume.name]
    export = config.nfs_export
    if export is not None:
        server, path = export
        volumes.append({"name": STORAGE_VOLUME, "nfs": {"server": server, "path": path}})
        folders = storage_subpaths(tenant, job_id)
        for place, sub in ((CHECKPOINT_MOUNT, folders.checkpoints), (OUTPUT_MOUNT, folders.outputs)):
            mounts.append({"name": STORAGE_VOLUME, "mountPath": place, "subPath": sub})
        env.update(storage_env(JobStorage(CHECKPOINT_MOUNT, OUTPUT_MOUNT)))
    return PodVolumes(volumes=volumes, mounts=mounts, env=env, working_dir=working_dir, copied=copies)
