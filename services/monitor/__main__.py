from gpuyard.services.monitor.main import main
from gpuyard.services.monitor.rules import rules_refusal
from gpuyard.shared.runtime.service import run_service
from gpuyard.shared.settings.monitor import MonitorSettings

if __name__ == "__main__":
    run_service("monitor", MonitorSettings, main, needs_store=True, needs_logs=True, preflight=rules_refusal)
