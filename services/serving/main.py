"""Wiring of the serving service: the serve jobs placed on this node held as ONNX Runtime sessions
(`host.py`), where every node's ready replicas are (`routing.py`), and the entry point on
`serving_host:serving_port` (`entry.py`, uvicorn in this event loop).

As the executor's: after reconciling what was placed here before (a restart), placements come from a durable
consumer of the node and the control events (cancel, preemption, the attempt's end) from another
(`gpuyard.shared.runtime.hosting`); the HTTP server is up first, so that a request during a restart's loading
is answered (503, or a hop) rather than refused."""

from __future__ import annotations

import contextlib
import logging

from gpuyard.services.serving.access import Access
from gpuyard.services.serving.entry import create_entry_app, entry_server
from gpuyard.services.serving.held import HeldSessions
from gpuyard.services.serving.host import Host
from gpuyard.services.serving.proxy import Forwarder
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Routes, running_in
from gpuyard.services.serving.stats import Stats
from gpuyard.shared.auth.secretfile import ScrapeAuth
from gpuyard.shared.auth.sessions import load_key as load_session_key
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.contracts.events.subjects import HOLDER_SERVING
from gpuyard.shared.modelfiles.store import ModelStore
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry as ModelCatalog

log = logging.getLogger(__name__)
PRUNE_INTERVAL = 30.0
"""Seconds between checks of the routes' jobs against the event store."""
CACHE_DIR = "serving"


def access_of(
    settings: ServingSettings, catalog: ModelCatalog, registry: ModelRegistry, routes: Routes
) -> Access:
    tokens = Tokens(settings.tokens_file, settings.tokens)
    if not tokens.table():
        log.warning("no tokens configured: every inference request will be refused (401)")
    key = load_session_key(
        settings.data_dir,
        settings.session_secret_file,
        without_it="the dashboard's sessions are not accepted",
    )
    access = Access(
        tokens,
        catalog,
        registry,
        routes,
        session_secret=key,
        dashboard_origins=settings.dashboard_origin_list,
    )
    routes.on_model_change = access.forget
    return access


async def main(service: Service, settings: ServingSettings) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per forwarded request
    registry = ModelRegistry()
    sessions = HeldSessions(
        registry, max_batch_size=settings.max_batch_size, max_queue_delay_us=settings.max_queue_delay_us
    )
    store, bus = service.store, service.bus
    catalog = ModelCatalog(store, bus, service.source, ModelStore(settings.model_store_url))
    routes = Routes(settings.node_name)
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
    app = create_entry_app(
        registry,
        access_of(settings, catalog, registry, routes),
        forwarder,
        Stats(),
        service_metrics=service.metrics,
        dashboard_origins=settings.dashboard_origin_list,
        max_request_bytes=settings.max_request_bytes,
        max_request_rows=settings.max_request_rows,
        scrape=ScrapeAuth.from_settings(settings),
    )
    server = entry_server(app, settings.serving_host, settings.serving_port)
    http = service.spawn(server.serve(), "http")
    service.metrics_served_on(settings.serving_host, settings.serving_port)  # (on the API's /metrics)
    try:
        await routes.follow(bus)
        service.spawn(routes.prune_every(running_in(store), PRUNE_INTERVAL), "routes")
        await host.reconcile()
        durable = f"serving-{settings.node_name}".replace(".", "-")
        await host.consume(
            bus,
            shared=durable,
            own=f"{durable}-control",
            holder=HOLDER_SERVING,
            max_deliver=settings.max_deliver,
            concurrency=settings.event_concurrency,
        )
        await host.reconcile()  # placed before the consumers existed
        where = (settings.serving_host, settings.serving_port, settings.advertised_url, settings.node_name)
        log.info("serving on %s:%d (advertised as %s), node %s", *where)
        await service.stopping.wait()
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await http
        await host.close()
        await forwarder.close()
