"""Where a platform's storage root is (`GPUYARD_STORAGE_ROOT`, or its default): what the executor makes jobs'
folders in and the submit API serves and takes files from (docs/storage.md)."""

from __future__ import annotations

from pathlib import Path

from gpuyard.shared.runtime.jobusers import JobUsers
from gpuyard.shared.runtime.paths import storage_root
from gpuyard.shared.settings.storage import StorageSettings


def storage_root_of(settings: StorageSettings) -> Path:
    """The storage root, from the settings (`storage_root`, and where its default is: whether jobs run as other
    users). ValueError for job users that cannot be used (the executor's preflight says so first)."""
    switches = JobUsers.from_setting(settings.job_users, settings.job_uid_base).switches
    return storage_root(
        settings.storage_root, settings.data_dir, settings.job_root, jobs_switch_users=switches
    )
