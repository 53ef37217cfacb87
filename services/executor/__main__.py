from gpuyard.services.executor.jobstorage import check_storage_reachable
from gpuyard.services.executor.main import main
from gpuyard.services.executor.privatetmp import check_reachable
from gpuyard.shared.runtime.jobusers import JobUsers
from gpuyard.shared.runtime.service import run_service
from gpuyard.shared.runtime.storageroot import storage_root_of
from gpuyard.shared.settings.executor import ExecutorSettings


def preflight(settings: ExecutorSettings) -> str | None:
    """Refuse to start, with the reason, on job users that cannot be used, or a job root or storage root jobs
    cannot reach."""
    if settings.executor_backend != "local":
        return None
    try:
        users = JobUsers.from_setting(settings.job_users, settings.job_uid_base)
        if users.switches:
            check_reachable(settings.job_root)
            check_storage_reachable(storage_root_of(settings))
    except ValueError as exc:
        return str(exc)
    return None


if __name__ == "__main__":
    run_service("executor", ExecutorSettings, main, needs_logs=True, preflight=preflight)
