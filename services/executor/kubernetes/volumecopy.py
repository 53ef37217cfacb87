"""Volumes kept in an object store (`GPUYARD_VOLUME_STORE`) in a job's pods: a pure function, no API calls.

A pod cannot mount a bucket, and the claim of such a volume would start empty (its files are objects, not a
folder of the storage root). So, as the local backend copies the volume to its node (`volumecache.py`), each
pod copies it into itself before the job starts:

- one `emptyDir` per pod (`volume-copies`) whose `sizeLimit` is the sum of the sizes of the volumes copied;
- an init container, `copy-volumes`, of the platform's image (`VolumeCopy.image`: it must hold gpuyard with
  the `s3` extra), that runs `volumefetch.py`: each volume's objects copied into
  `volume-cache/<tenant>/<name>/` of that emptyDir, as the local backend's copy is laid out. Its credentials
  and endpoint are the keys of a Secret (`VolumeCopy.secret`: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
  AWS_ENDPOINT_URL…) given as its environment, never inline; the job's container never gets them. It asks the
  CPU and memory the job's container asks (no GPU), so the pod asks no more than before and keeps its QoS;
- the job's container mounts each volume's folder of the emptyDir (by subPath) at the volume's place,
  read-only: the kubelet makes a write fail with "Read-only file system".

A copy that fails (store unreachable, credentials refused, a volume larger than its size) fails the init
container, and so the pod, before the job's command runs: the replica fails to start with the copy's reason
(`outcomes.py`). Nothing is kept between pods: every pod of every attempt copies the whole volume.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from gpuyard.services.executor.volumecache import VOLUME_CACHE

COPY_CONTAINER = "copy-volumes"
COPIES_VOLUME = "volume-copies"
COPIES_MOUNT = "/gpuyard/volume-copies"
FETCH_MODULE = "gpuyard.services.executor.kubernetes.volumefetch"
STORE_VARIABLE = "GPUYARD_VOLUME_STORE"


@dataclass(frozen=True)
class VolumeCopy:
    """Where volumes live and how a pod copies them: the object store's URL (`GPUYARD_VOLUME_STORE`), the image
    that copies (the platform's own) and the Secret whose keys are its credentials (None: the image's or the
    node's own, e.g. a workload identity)."""

    store: str
    image: str
    secret: str | None = None


@dataclass(frozen=True)
class CopiedVolumes:
    """The volumes of one job that its pods copy from the object store: volume name → its size in bytes."""

    copy: VolumeCopy
    sizes: Mapping[str, int]


def copy_subpath(tenant: str, name: str) -> str:
    """The volume's folder in the pod's emptyDir (`volumecache.VolumeCache.folder` under that root)."""
    return str(PurePosixPath(VOLUME_CACHE, tenant, name))


def copies_volume(copied: CopiedVolumes) -> dict[str, Any]:
    """The pod's emptyDir that holds the copies, no larger than the volumes it holds."""
    return {"name": COPIES_VOLUME, "emptyDir": {"sizeLimit": str(max(1, sum(copied.sizes.values())))}}


def copy_mount(tenant: str, name: str, place: str) -> dict[str, Any]:
    """The job container's read-only mount of the copy of volume `name` at `place`."""
    return {
        "name": COPIES_VOLUME,
        "mountPath": place,
        "subPath": copy_subpath(tenant, name),
        "readOnly": True,
    }


def copy_container(
    copied: CopiedVolumes, tenant: str, *, resources: Mapping[str, Mapping[str, str]], pull_policy: str
) -> dict[str, Any]:
    """The init container that copies the volumes; `resources`: the job container's (its GPUs left out)."""
    kept = {"cpu", "memory", "ephemeral-storage"}
    container: dict[str, Any] = {
        "name": COPY_CONTAINER,
        "image": copied.copy.image,
        "imagePullPolicy": pull_policy,
        "command": ["python", "-P", "-m", FETCH_MODULE, COPIES_MOUNT, tenant, *sorted(copied.sizes)],
        "env": [{"name": STORE_VARIABLE, "value": copied.copy.store}],
        "resources": {
            part: {k: v for k, v in amounts.items() if k in kept} for part, amounts in resources.items()
        },
        "volumeMounts": [{"name": COPIES_VOLUME, "mountPath": COPIES_MOUNT}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if copied.copy.secret:
        container["envFrom"] = [{"secretRef": {"name": copied.copy.secret}}]
    return container
