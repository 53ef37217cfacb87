"""The settings of what jobs keep and read beyond an attempt, which the executor (that makes the folders and
runs the jobs) and the submit API (that serves their files and takes uploads) both read: the users jobs run as,
where their folders are, and volumes' sizes."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gpuyard.shared.settings.common import CommonSettings, Size, TenantSizes, written


class StorageSettings(CommonSettings):
    """Shared by the executor and the submit API."""

    job_users: str = Field(
        "",
        description="Local user of each tenant's jobs when the platform runs as root: `vision=gpu-vision,"
        "nlp=1500:1500,*=nobody` (a name or uid[:gid]; `*`: every other tenant); empty: each tenant its own "
        "uid, JOB_UID_BASE + a number derived from its name, no account needed. Never root.",
    )
    job_uid_base: int = Field(
        2_000_000, ge=1, description="First uid of the users derived from tenants' names (see JOB_USERS)."
    )
    job_root: Path = Field(
        Path("/var/lib/gpuyard-jobs"),
        description="Where jobs that run as other users get their working directories (outside the private "
        "data directory; every folder above it must be searchable by all). Unused when not root.",
    )
    storage_root: Path | None = Field(
        None,
        description="Where jobs keep what outlives an attempt: `checkpoints/<tenant>/<job id>/` and "
        "`outputs/<tenant>/<job id>/` (GPUYARD_CHECKPOINT_DIR and GPUYARD_OUTPUT_DIR of each replica), shared by "
        "every attempt of a job and deleted after its retention. A shared filesystem mounted at the same path on "
        "every node lets a job resume on another node. Default: storage/ in the data dir; where jobs run as "
        "other users (a root platform), storage/ in the job root (every folder above it must be searchable "
        "by all). See docs/storage.md.",
    )
    volume_store: str = Field(
        "",
        description="Where volumes' files live: empty, folders of the storage root (`volumes/<tenant>/<name>/`); "
        "an fsspec URL such as s3://bucket/prefix, objects under `<prefix>/volumes/<tenant>/<name>/` (needs the "
        "`s3` extra; credentials and endpoint as for MODEL_STORE: the standard AWS variables or ~/.aws). Jobs "
        "then get a copy in the storage root's `volume-cache/`, mounted read-only. See docs/volumes.md.",
    )
    output_store: str = Field(
        "",
        description="Where jobs' kept outputs live once an attempt has ended: empty, their folders of the storage "
        "root (`outputs/<tenant>/<job id>/`); an fsspec URL such as s3://bucket/prefix, objects under "
        "`<prefix>/outputs/<tenant>/<job id>/`, copied there by the executor after each attempt (what changed) "
        "and served by the API from there (credentials and endpoint as for MODEL_STORE). See docs/storage.md.",
    )
    volume_default_size: Size = Field(
        written("10GiB"),
        ge=1,
        description="The size of a volume made without one (`gpuyard volumes create`).",
    )
    volume_quota: TenantSizes = Field(
        default_factory=dict,
        description="What a tenant's volumes may hold together (their sizes), per tenant: `vision=500GB,"
        "*=100GB` (`*`: every other tenant); a tenant not named and no `*`: no limit. See docs/volumes.md.",
    )


def quota_of(quotas: dict[str, int], tenant: str) -> int:
    """A tenant's volume quota in bytes (`volume_quota`); 0: no limit."""
    return int(quotas.get(tenant, quotas.get("*", 0)))
