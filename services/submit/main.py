"""Wiring of the submit service: tokens, the HTTP API on uvicorn, telemetry from the bus, the stores' retention
sweep (`retention.py`)."""

from __future__ import annotations

import contextlib
import logging

import uvicorn

from gpuyard.services.submit import following, retention, volumestores
from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.context import JobOutputs, SubmitContext, Uploads
from gpuyard.services.submit.jobproxy import JobProxy
from gpuyard.services.submit.queuedepth import QueueDepth
from gpuyard.services.submit.volumemetrics import VolumeMetrics
from gpuyard.shared.auth import sessions
from gpuyard.shared.auth.jobtokens import secret_path
from gpuyard.shared.auth.secretfile import ScrapeAuth
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.modelfiles.signature import CheckBounds
from gpuyard.shared.modelfiles.store import ModelStore
from gpuyard.shared.runtime.outputstore import OutputStore
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.submit import SubmitSettings
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeRegistry

log = logging.getLogger(__name__)
CACHED_JOBS = 1000
"""Job views the submit service's ledger keeps: it writes a job's first event and, rarely, its cancel; the
other services write the rest, which it never sees, so a larger cache would only hold stale queued views."""


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the service runtime owns SIGTERM/SIGINT
        yield


async def main(service: Service, settings: SubmitSettings) -> None:
    # (a store and its ledger: needs_store, the default; the log store: needs_logs, __main__)
    store, ledger, logs, bus = service.store, service.ledger, service.logs, service.bus
    ledger.cached_jobs = CACHED_JOBS
    tokens = Tokens(settings.tokens_file, settings.tokens)
    if not tokens.table():
        log.warning("no tokens configured: every request will be refused (401)")
    files = await volumestores.volume_files_of(settings)
    volumes = VolumeRegistry(store, bus, service.source)
    volume_metrics = VolumeMetrics(volumes, files, settings.volume_quota)
    output_store = OutputStore(settings.output_store) if settings.output_store else None
    ctx = SubmitContext(
        store=store,
        ledger=ledger,
        tokens=tokens,
        logs=logs,
        bus=bus,
        max_body_bytes=settings.max_body_bytes,
        queue=QueueDepth(settings.max_queued_per_tenant, settings.queue_limits),
        accept_unplaceable=settings.accept_unplaceable,
        models=ModelRegistry(store, bus, service.source, ModelStore(settings.model_store_url)),
        max_model_bytes=settings.max_model_bytes,
        uploads=Uploads(limit=settings.max_uploads_per_tenant),
        model_check=CheckBounds(
            seconds=settings.model_check_timeout, memory_bytes=settings.model_check_memory
        ),
        publish_secret_file=secret_path(settings.data_dir, settings.publish_secret_file),
        session_secret=sessions.load_key(
            settings.data_dir, settings.session_secret_file, without_it="the dashboard's login is off"
        ),
        session_lifetime=settings.session_lifetime,
        serving_url=settings.serving_url,
        quotas=settings.quotas,
        volumes=volumes,
        volume_files=files,
        volume_default_size=settings.volume_default_size,
        volume_quotas=settings.volume_quota,
        job_outputs=output_store or JobOutputs(files.root, files.owner_of),  # (the volumes' root and users)
        volume_metrics=volume_metrics,
        scrape=ScrapeAuth.from_settings(settings),
    )
    await following.follow(bus, ctx.telemetry)
    service.spawn(ctx.queue.follow(store), "queue-depth")
    service.spawn(volume_metrics.run(), "volume-metrics")
    service.spawn(
        retention.run(store, logs, settings.retention, settings.retention_interval, output_store),
        "retention",
    )
    app = create_app(ctx)
    app.state.job_proxy = JobProxy.from_settings(settings)  # (exec, shell, ports: the nodes' gateways)
    config = uvicorn.Config(
        app,
        host=settings.submit_host,
        port=settings.submit_port,
        log_level="warning",
        access_log=False,
    )
    server = _Server(config)
    serving = service.spawn(server.serve(), "http")
    service.metrics_served_on(settings.submit_host, settings.submit_port)  # (on the API's /metrics)
    try:
        await service.stopping.wait()
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await serving
