"""The serving service. For now it announces itself (service heartbeat, health probes); ONNX models behind
an Open Inference Protocol endpoint come with the serving issue."""

from __future__ import annotations

import logging

from shared.service import Service
from shared.settings import ServingSettings

log = logging.getLogger(__name__)


async def main(service: Service, settings: ServingSettings) -> None:
    log.info("serving ready (no models published yet)")
    await service.stopping.wait()
