from gpuyard.services.submit.main import main
from gpuyard.services.submit.preflight import preflight
from gpuyard.shared.runtime.service import run_service
from gpuyard.shared.settings.submit import SubmitSettings

if __name__ == "__main__":
    run_service("submit", SubmitSettings, main, needs_logs=True, preflight=preflight)
