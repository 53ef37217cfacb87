"""Each service's own Prometheus figures, in one registry per service process: who it is
(`gpuyard_service_info{service, instance, version} 1`), the process figures prometheus-client reads from /proc
(`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_open_fds`, ...), the Python runtime's
(`python_info`, `python_gc_*`), and what its bus consumers do (`gpuyard.shared.bus.metrics`).

A service serves them on a port of its own when `service_metrics_port` is set (`MetricsServer`; `gpuyard up`
sets it for each process); the submit API, the serving API and the monitor's /metrics serve them too, with what
they serve (docs/operations.md, "Metrics of each service").
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Self

from prometheus_client import CollectorRegistry, GCCollector, Info, PlatformCollector, ProcessCollector
from prometheus_client.exposition import generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The text format `render` writes (prometheus-client's `generate_latest`), which every Prometheus reads."""
METRICS_PATH = "/metrics"


def service_registry(service: str, instance: str, version: str) -> CollectorRegistry:
    """A new registry with the figures every service has; its bus figures are added by `BusMetrics`."""
    registry = CollectorRegistry(auto_describe=True)
    about = Info(
        "gpuyard_service",
        "The service this process runs (1), with its name, instance and version. Prometheus keeps its own "
        "`instance` label (the scraped address) and shows this one as `exported_instance`.",
        registry=registry,
    )
    about.info({"service": service, "instance": instance, "version": version})
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)  # (nothing where the interpreter has no gc statistics)
    return registry


def render(*registries: CollectorRegistry) -> bytes:
    """The registries' figures in the Prometheus text format, one after the other."""
    return b"".join(generate_latest(registry) for registry in registries)


class MetricsServer:
    """`GET /metrics` in the Prometheus text format, served by a thread (a scrape never waits for the event
    loop, nor the loop for a scrape's rendering beyond the GIL)."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, path: str = METRICS_PATH):
        """OSError when the address cannot be bound (the port is taken)."""
        self.registry = registry
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if server.refused(self):
                    return
                if self.path.split("?")[0] != path:
                    self.send_error(404, f"only {path} is served here")
                    return
                body = render(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args) -> None:  # noqa: A002
                pass  # (a scrape every few seconds is not news)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics", daemon=True)

    def refused(self, request: BaseHTTPRequestHandler) -> bool:
        """Whether `request` was refused, its answer sent (a subclass that guards the figures refuses some:
        the monitor's `GuardedMetricsServer`); here none is."""
        return False

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
