"""The Kubernetes objects of one GPUYARD volume, as plain dicts: a pure function, no API calls.

A volume (tenant, name, size) is one PersistentVolumeClaim in the backend's namespace, ReadWriteMany (the
replicas of every job that mounts it, on any node, see it at once), requesting the volume's size, of the storage
class `KubernetesConfig.volume_storage_class` (unset: the cluster's default class, which provisions it empty).

With the storage root's NFS export set (`volume_nfs_server`, `volume_nfs_path`), the claim is bound to a
PersistentVolume of its own instead: the volume's folder of that export (`<path>/volumes/<tenant>/<name>`, the
layout of `paths.volume_dir`), so that the pods see the bytes the API's uploads wrote. Its reclaim policy is
Retain: deleting it never deletes the files (the submit service does, when the volume is deleted). Both then
carry the storage class named, or none (""), so that the cluster's default class does not take the claim.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuyard.services.executor.kubernetes import labels as job_labels
from gpuyard.services.executor.kubernetes.config import KubernetesConfig
from gpuyard.services.executor.kubernetes.names import persistent_volume_name, volume_claim_name
from gpuyard.shared.runtime.paths import volume_dir

ACCESS_MODES = ["ReadWriteMany"]


@dataclass(frozen=True)
class VolumeObjects:
    claim: dict[str, Any]
    persistent_volume: dict[str, Any] | None
    """The claim's own PersistentVolume with the NFS export set; None: the claim is provisioned by its class."""

    @property
    def claim_name(self) -> str:
        return str(self.claim["metadata"]["name"])


def volume_objects(
    *, tenant: str, volume: str, size_bytes: int, created: str, config: KubernetesConfig
) -> VolumeObjects:
    """The claim (and PersistentVolume) of `tenant`'s volume `volume`, made at `created` (ISO time)."""
    namespace = config.namespace
    claim_name = volume_claim_name(config.name_prefix, tenant, volume, created)
    labels = job_labels.volume_labels(tenant, volume, config.extra_labels)
    annotations = job_labels.volume_annotations(tenant, volume, created)
    size = str(size_bytes)
    claim_spec: dict[str, Any] = {
        "accessModes": list(ACCESS_MODES),
        "resources": {"requests": {"storage": size}},
    }
    export = config.nfs_export
    if export is None:
        if config.volume_storage_class:
            claim_spec["storageClassName"] = config.volume_storage_class
        return VolumeObjects(
            claim=_claim(claim_name, namespace, labels, annotations, claim_spec), persistent_volume=None
        )
    pv_name = persistent_volume_name(config.name_prefix, namespace, tenant, volume, created)
    storage_class = config.volume_storage_class or ""
    claim_spec.update(storageClassName=storage_class, volumeName=pv_name)
    server, path = export
    pv = {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": pv_name,
            "labels": {**labels, **job_labels.volume_selector(namespace)},
            "annotations": annotations,
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(ACCESS_MODES),
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": storage_class,
            "nfs": {"server": server, "path": str(volume_dir(path, tenant, volume))},
            "claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": namespace,
                "name": claim_name,
            },
        },
    }
    return VolumeObjects(
        claim=_claim(claim_name, namespace, labels, annotations, claim_spec), persistent_volume=pv
    )


def _claim(
    name: str, namespace: str, labels: dict[str, str], annotations: dict[str, str], spec: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": spec,
    }
