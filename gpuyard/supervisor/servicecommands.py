"""How `gpuyard up` runs each service: the services in start order with their settings models, and a service
process's command line (its module run by this interpreter, with the settings `up` decides as flags)."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping

from gpuyard.shared.settings.common import CommonSettings
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.names import flag_name
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.shared.settings.submit import SubmitSettings

SERVICES: dict[str, type[CommonSettings]] = {  # in start order
    "submit": SubmitSettings,
    "scheduler": SchedulerSettings,
    "executor": ExecutorSettings,
    "monitor": MonitorSettings,
    "serving": ServingSettings,
}
OWN_METRICS = ("scheduler", "executor")
"""The services `gpuyard up` gives a /metrics port of their own: the others serve theirs on their HTTP port."""


def service_command(name: str) -> list[str]:
    """How a service starts: its module run by this interpreter, with -P (the working directory is not searched:
    a `services/` or `shared/` folder there is never imported in the platform's place)."""
    return [sys.executable, "-P", "-m", f"gpuyard.services.{name.split('-')[0]}"]


def settings_flags(model: type[CommonSettings], values: Mapping[str, object]) -> list[str]:
    """`values` that are settings of `model`, as its flags: {'policy': 'fgd'} -> ['--policy', 'fgd']."""
    flags = []
    for name, value in values.items():
        if name in model.model_fields:
            flags += [flag_name(name), str(value)]
    return flags


def health_flags(model: type, ports: Iterator[int]) -> list[str]:
    """The flag of the next of `ports` as `model`'s health port; none when no port is left (none picked)."""
    port = next(ports, None)
    return settings_flags(model, {"health_port": port}) if port is not None else []
