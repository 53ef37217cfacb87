"""The Kubernetes objects of one attempt of one job, as plain dicts: a pure function, no API calls.

One bare Pod per replica, not one Indexed Job per job, because:
- each replica is placed on its own node by GPUYARD's scheduler, and an Indexed Job has one pod template, so
  it cannot pin index i to node i (nor give replicas different GPU shares);
- GPUYARD retries failed attempts itself (new attempt, new placement); a Job's own retries
  (backoffLimit, pod replacement) would fight it, so pods use restartPolicy Never and nothing recreates them;
- a pod's phase and container status are exactly what the outcome mapping needs; a Job adds a second
  status to reconcile.

A multi-replica attempt also gets a headless Service; with each pod's `hostname` and `subdomain` it gives
replica 0 the stable DNS name used as MASTER_ADDR. Ownership: replica 0's pod owns the Service and the other
pods (the controller adds that reference once replica 0 exists and has a uid, see `with_owner`), so deleting
replica 0 deletes the whole attempt; `KubernetesConfig.owner`, when set, owns replica 0.

Every pod mounts the claims of the job's volumes and, with the storage root's NFS export set, its checkpoint and
output folders (`podvolumes.py`); the claims themselves are made before the pods (`volumeclaims.py`). Volumes
kept in the object store are copied into each pod by an init container first (`volumecopy.py`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuyard.services.executor.kubernetes import labels as job_labels
from gpuyard.services.executor.kubernetes.config import KubernetesConfig, OwnerTarget
from gpuyard.services.executor.kubernetes.env import replica_env
from gpuyard.services.executor.kubernetes.names import AttemptNames, attempt_names
from gpuyard.services.executor.kubernetes.podvolumes import PodVolumes, pod_volumes
from gpuyard.services.executor.kubernetes.resources import container_resources
from gpuyard.services.executor.kubernetes.volumecopy import CopiedVolumes, copy_container
from gpuyard.shared.contracts.events.jobs import ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec

CONTAINER = "worker"


@dataclass(frozen=True)
class JobManifests:
    names: AttemptNames
    pods: list[dict[str, Any]]
    """One per replica, in replica order."""
    service: dict[str, Any] | None
    """The headless Service of a multi-replica attempt; None for one replica."""


def owner_reference(api_version: str, kind: str, name: str, uid: str) -> dict[str, Any]:
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "blockOwnerDeletion": False}


def pod_owner_reference(pod: dict[str, Any]) -> dict[str, Any]:
    """A reference to a pod the API server returned (it has a uid)."""
    return owner_reference("v1", "Pod", pod["metadata"]["name"], pod["metadata"]["uid"])


def with_owner(obj: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """A copy of `obj` with `reference` added to its owner references."""
    owned = copy.deepcopy(obj)
    owned["metadata"].setdefault("ownerReferences", []).append(reference)
    return owned


def build_job_manifests(
    *,
    job_id: str,
    attempt: int,
    job_name: str,
    tenant: str,
    spec: JobSpec,
    placements: Sequence[ReplicaPlacement],
    config: KubernetesConfig,
    claims: Mapping[str, str] | None = None,
    copied: CopiedVolumes | None = None,
) -> JobManifests:
    """`claims`: the claim's name of each volume the spec mounts (`volumeobjects.py`); `copied`: the volumes
    copied from the object store instead (`volumecopy.py`)."""
    by_replica = sorted(placements, key=lambda p: p.replica)
    if [p.replica for p in by_replica] != list(range(spec.replicas)):
        raise ValueError(
            f"job {job_id} has {spec.replicas} replica(s) but placements for "
            f"{[p.replica for p in by_replica]}"
        )
    names = attempt_names(config.name_prefix, job_name or job_id, job_id, attempt)
    common = job_labels.attempt_labels(job_id, attempt, tenant, config.extra_labels)
    annotations = {
        job_labels.JOB_ID_EXACT: job_id,
        job_labels.JOB_NAME: job_name,
        job_labels.REPLICAS: str(spec.replicas),
    }
    distributed = spec.replicas > 1
    mounted = pod_volumes(
        spec=spec, tenant=tenant, job_id=job_id, claims=claims or {}, config=config, copied=copied
    )
    pods = [
        _pod(
            job_id=job_id,
            job_name=job_name,
            tenant=tenant,
            attempt=attempt,
            spec=spec,
            placement=placement,
            names=names,
            labels={**common, job_labels.REPLICA: str(placement.replica)},
            annotations={**annotations, job_labels.NODE: placement.node},
            distributed=distributed,
            mounted=mounted,
            config=config,
        )
        for placement in by_replica
    ]
    if config.owner is not None:
        pods[0] = with_owner(pods[0], _target_reference(config.owner))
    service = _headless_service(job_id, attempt, names, common, annotations, config) if distributed else None
    return JobManifests(names=names, pods=pods, service=service)


def _target_reference(owner: OwnerTarget) -> dict[str, Any]:
    return owner_reference(owner.api_version, owner.kind, owner.name, owner.uid)


def _headless_service(
    job_id: str,
    attempt: int,
    names: AttemptNames,
    labels: dict[str, str],
    annotations: dict[str, str],
    config: KubernetesConfig,
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service,
            "namespace": config.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "clusterIP": "None",
            "selector": job_labels.attempt_selector(job_id, attempt),
            # Replicas must find each other before they are Ready (they have no readiness probe anyway).
            "publishNotReadyAddresses": True,
            "ports": [
                {
                    "name": "rendezvous",
                    "port": config.master_port,
                    "targetPort": config.master_port,
                    "protocol": "TCP",
                }
            ],
        },
    }


def pod_image(spec: JobSpec, config: KubernetesConfig) -> str:
    """The job's own image (`environment: {image: ...}`, docs/environments.md), else the platform's."""
    env = spec.environment
    return env.image if env is not None and env.image else config.image


def _pod(
    *,
    job_id: str,
    job_name: str,
    tenant: str,
    attempt: int,
    spec: JobSpec,
    placement: ReplicaPlacement,
    names: AttemptNames,
    labels: dict[str, str],
    annotations: dict[str, str],
    distributed: bool,
    mounted: PodVolumes,
    config: KubernetesConfig,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": pod_image(spec, config),
        "imagePullPolicy": config.image_pull_policy,
        "command": spec.argv,
        "env": replica_env(
            job_id=job_id,
            job_name=job_name,
            tenant=tenant,
            attempt=attempt,
            spec=spec,
            placement=placement,
            names=names,
            namespace=config.namespace,
            master_port=config.master_port,
            mounts=mounted.env,
        ),
        "resources": container_resources(spec.resources, placement, config),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    working_dir = mounted.working_dir or spec.working_dir
    if working_dir:
        container["workingDir"] = working_dir
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [container],
        "affinity": _node_affinity(config.node_label, placement.node),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": config.termination_grace_seconds,
    }
    if distributed:
        pod_spec["hostname"] = names.pod(placement.replica)
        pod_spec["subdomain"] = names.service
    if spec.timeout is not None:
        pod_spec["activeDeadlineSeconds"] = max(1, math.ceil(spec.timeout))
    if config.service_account:
        pod_spec["serviceAccountName"] = config.service_account
    if config.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in config.image_pull_secrets]
    if config.tolerations:
        pod_spec["tolerations"] = copy.deepcopy(config.tolerations)
    if mounted.volumes:
        pod_spec["volumes"] = copy.deepcopy(mounted.volumes)
        container["volumeMounts"] = copy.deepcopy(mounted.mounts)
    if mounted.copied is not None:
        pod_spec["initContainers"] = [
            copy_container(
                mounted.copied,
                tenant,
                resources=container["resources"],
                pull_policy=config.image_pull_policy,
            )
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": names.pod(placement.replica),
            "namespace": config.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def _node_affinity(node_label: str, node: str) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": node_label, "operator": "In", "values": [node]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
