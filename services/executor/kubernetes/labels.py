"""Labels and annotations GPUYARD puts on the objects of a job and on the claims of volumes, and the selectors
that find them again.

Label values must be short and plain, so a job id that is not is hashed in its label (see
`names.label_value`); the exact id always travels in the `gpuyard.io/job-id` annotation.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuyard.services.executor.kubernetes.names import label_value

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpuyard"
PART_OF = "app.kubernetes.io/part-of"
COMPONENT = "app.kubernetes.io/component"
JOB_ID = "gpuyard.io/job-id"
ATTEMPT = "gpuyard.io/attempt"
REPLICA = "gpuyard.io/replica"
TENANT = "gpuyard.io/tenant"
VOLUME = "gpuyard.io/volume"
NAMESPACE = "gpuyard.io/namespace"
# Annotations
JOB_ID_EXACT = "gpuyard.io/job-id"
JOB_NAME = "gpuyard.io/job-name"
NODE = "gpuyard.io/node"
REPLICAS = "gpuyard.io/replicas"
TENANT_EXACT = "gpuyard.io/tenant"
VOLUME_EXACT = "gpuyard.io/volume"
VOLUME_CREATED = "gpuyard.io/volume-created"


def managed_selector() -> dict[str, str]:
    return {MANAGED_BY: MANAGER}


def attempt_selector(job_id: str, attempt: int) -> dict[str, str]:
    return {**managed_selector(), JOB_ID: label_value(job_id), ATTEMPT: str(attempt)}


def replica_selector(job_id: str, attempt: int, replica: int) -> dict[str, str]:
    return {**attempt_selector(job_id, attempt), REPLICA: str(replica)}


def attempt_labels(
    job_id: str, attempt: int, tenant: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """Labels of every object of an attempt. GPUYARD's own labels win over `extra` ones."""
    return {
        **(extra or {}),
        COMPONENT: "job",
        **attempt_selector(job_id, attempt),
        TENANT: label_value(tenant),
    }


def volume_selector(namespace: str | None = None) -> dict[str, str]:
    """Every volume claim GPUYARD made (`namespace`: every PersistentVolume it made for the claims there)."""
    selector = {PART_OF: MANAGER, **managed_selector(), COMPONENT: "volume"}
    return {**selector, NAMESPACE: label_value(namespace)} if namespace else selector


def volume_labels(tenant: str, volume: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Labels of a volume's claim and PersistentVolume (the exact names go in annotations: `volume_annotations`)."""
    return {**(extra or {}), **volume_selector(), TENANT: label_value(tenant), VOLUME: label_value(volume)}


def volume_annotations(tenant: str, volume: str, created: str) -> dict[str, str]:
    return {TENANT_EXACT: tenant, VOLUME_EXACT: volume, VOLUME_CREATED: created}


def selector_string(selector: Mapping[str, str]) -> str:
    """The `key=value,…` form the API's labelSelector parameter takes."""
    return ",".join(f"{key}={value}" for key, value in selector.items())
