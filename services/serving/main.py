"""Wiring of the serving service: the serve jobs placed on this node held as ONNX Runtime sessions
(`host.py`), where every node's ready replicas are (`routing.py`), and the entry point on
`serving_host:serving_port` (`entry.py`, uvicorn in this event loop).

As the executor's: after reconciling what was placed here before (a restart), placements come from a durable
consumer of the node and the control events (cancel, preemption, the attempt's end) from another; the HTTP
server is up first, so that a request during a restart's loading is answered (503, or a hop) rather than
refused."""

from __future__ import annotations

import contextlib
import logging

import uvicorn

from gpuyard.services.serving.access import Access
from gpuyard.services.serving.entry import create_entry_app
from gpuyard.services.serving.held import HeldSessions
from gpuyard.services.serving.host import CONTROL_SUBJECTS, PLACEMENT_SUBJECTS, Host
from gpuyard.services.serving.proxy import Forwarder
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Routes
from gpuyard.services.serving.stats import Stats
from gpuyard.shared.auth.secretfile import ScrapeAuth
from gpuyard.shared.auth.sessions import load_key as load_session_key
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.bus.jetstream import placed_for
from gpuyard.shared.contracts.events.subjects import EVENTS_STREAM, HOLDER_SERVING
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.modelfiles.store import ModelStore
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.shared.stores.events import EventStore
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry as ModelCatalog

log = logging.getLogger(__name__)
PRUNE_INTERVAL = 30.0
"""Seconds between checks of the routes' jobs against the event store."""
CACHE_DIR = "serving"


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the service runtime owns SIGTERM/SIGINT
        yield


def running_jobs(store: EventStore):
    async def running(job_ids: list[str]) -> set[str]:
        alive = set()
        for job_id in job_ids:
            doc = await store.get_projection(job_id)
            if doc is not None and doc.get("state") == JobState.RUNNING:
                alive.add(job_id)
        return alive

    return running


async def main(service: Service, settings: ServingSettings) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per forwarded request
    registry = ModelRegistry()
    sessions = HeldSessions(
        registry,
        max_batch_size=settings.max_batch_size,
        max_queue_delay_us=settings.max_queue_delay_us,
    )
    catalog = ModelCatalog(service.store, service.bus, service.source, ModelStore(settings.model_store_url))
    routes = Routes(settings.node_name)
    tokens = Tokens(settings.tokens_file, settings.tokens)
    if not tokens.table():
        log.warning("no tokens configured: every inference request will be refused (401)")
    origins = settings.dashboard_origin_list
    access = Access(
        tokens,
        catalog,
        registry,
        routes,
        session_secret=load_session_key(
            settings.data_dir,
            settings.session_secret_file,
            without_it="the dashboard's sessions are not accepted",
        ),
        dashboard_origins=origins,
    )
    routes.on_model_change = access.forget
    forwarder = Forwarder(registry, routes)
    host = Host(
        service,
        node=settings.node_name,
        endpoint=settings.advertised_url,
        sessions=sessions,
        catalog=catalog,
        cache_dir=settings.data_dir / CACHE_DIR,
        retry_backoff=settings.retry_backoff,
        intra_op_threads=settings.serving_threads,
    )
    config = uvicorn.Config(
        create_entry_app(
            registry,
            access,
            forwarder,
            Stats(),
            service_metrics=service.metrics,
            dashboard_origins=origins,
            max_request_bytes=settings.max_request_bytes,
            max_request_rows=settings.max_request_rows,
            scrape=ScrapeAuth.from_settings(settings),
        ),
        host=settings.serving_host,
        port=settings.serving_port,
        log_level="warning",
        access_log=False,
    )
    server = _Server(config)
    http = service.spawn(server.serve(), "http")
    service.metrics_served_on(settings.serving_host, settings.serving_port)  # (on the API's /metrics)
    try:
        await routes.follow(service.bus)
        service.spawn(routes.prune_every(running_jobs(service.store), PRUNE_INTERVAL), "routes")
        await host.reconcile()
        durable = f"serving-{settings.node_name}".replace(".", "-")
        for name, subjects, wanted in (
            (durable, PLACEMENT_SUBJECTS, placed_for(HOLDER_SERVING)),
            (f"{durable}-control", CONTROL_SUBJECTS, host.concerns),
        ):
            await service.bus.consume(
                name,
                subjects,
                host.on_event,
                stream=EVENTS_STREAM.name,
                max_deliver=settings.max_deliver,
                concurrency=settings.event_concurrency,
                wanted=wanted,
            )
        await host.reconcile()  # placed before the consumers existed
        log.info(
            "serving on %s:%d (advertised as %s), node %s",
            settings.serving_host,
            settings.serving_port,
            settings.advertised_url,
            settings.node_name,
        )
        await service.stopping.wait()
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await http
        await host.close()
        await forwarder.close()
