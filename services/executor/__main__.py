from services.executor.main import main
from shared.service import run_service
from shared.settings import ExecutorSettings

if __name__ == "__main__":
    run_service("executor", ExecutorSettings, main, needs_logs=True)
