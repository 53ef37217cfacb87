from services.scheduler.main import main
from shared.service import run_service
from shared.settings import SchedulerSettings

if __name__ == "__main__":
    run_service("scheduler", SchedulerSettings, main)
