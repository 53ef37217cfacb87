from gpuyard.services.scheduler.main import main
from gpuyard.shared.service import run_service
from gpuyard.shared.settings import SchedulerSettings

if __name__ == "__main__":
    run_service("scheduler", SchedulerSettings, main)
