from gpuyard.services.scheduler.main import main
from gpuyard.shared.runtime.service import run_service
from gpuyard.shared.settings.scheduler import SchedulerSettings

if __name__ == "__main__":
    run_service("scheduler", SchedulerSettings, main)
