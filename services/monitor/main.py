"""The monitor service. For now it announces itself (service heartbeat, health probes) and reports what
NVML finds on its node; GPU sampling, Prometheus metrics and alerts come with the monitoring issue."""

from __future__ import annotations

import asyncio
import logging

from shared.gpus import nvml_gpus
from shared.service import Service
from shared.settings import MonitorSettings

log = logging.getLogger(__name__)


async def main(service: Service, settings: MonitorSettings) -> None:
    gpus = await asyncio.to_thread(nvml_gpus)
    if gpus:
        log.info(
            "node %s: %d NVIDIA GPU(s): %s", settings.node_name, len(gpus), ", ".join(g.model for g in gpus)
        )
    else:
        log.info("node %s: no NVIDIA GPU (NVML unavailable); nothing to sample", settings.node_name)
    await service.stopping.wait()
