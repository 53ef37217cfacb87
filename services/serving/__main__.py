from gpuyard.services.serving.main import main
from gpuyard.shared.runtime.service import run_service
from gpuyard.shared.settings.serving import ServingSettings

if __name__ == "__main__":
    run_service("serving", ServingSettings, main, pauses_matter=True)  # (each inference waits on it)
