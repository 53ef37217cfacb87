"""Labels and annotations GPUYARD puts on the objects of a job, and the selectors that find them again.

Label values must be short and plain, so a job id that is not is hashed in its label (see
`names.label_value`); the exact id always travels in the `gpuyard.io/job-id` annotation.
"""

from __future__ import annotations

from collections.abc import Mapping

from gpuyard.services.executor.kubernetes.names import label_value

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "gpuyard"
COMPONENT = "app.kubernetes.io/component"
JOB_ID = "gpuyard.io/job-id"
ATTEMPT = "gpuyard.io/attempt"
REPLICA = "gpuyard.io/replica"
TENANT = "gpuyard.io/tenant"
# Annotations
JOB_ID_EXACT = "gpuyard.io/job-id"
JOB_NAME = "gpuyard.io/job-name"
NODE = "gpuyard.io/node"
REPLICAS = "gpuyard.io/replicas"


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


def selector_string(selector: Mapping[str, str]) -> str:
    """The `key=value,…` form the API's labelSelector parameter takes."""
    return ",".join(f"{key}={value}" for key, value in selector.items())
