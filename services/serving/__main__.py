from services.serving.main import main
from shared.service import run_service
from shared.settings import ServingSettings

if __name__ == "__main__":
    run_service("serving", ServingSettings, main, pauses_matter=True)  # (each inference waits on it)
