"""The serving service's settings: the inference port, batching, limits."""

from __future__ import annotations

import socket
from pathlib import Path

from pydantic import Field

from gpuyard.shared.settings.common import Port, Size
from gpuyard.shared.settings.scrape import ScrapeSettings


class ServingSettings(ScrapeSettings):
    """Model serving: the node's serving service hosts the serve jobs placed on its node (ONNX Runtime
    sessions) and answers the Open Inference Protocol (docs/serving.md)."""

    serving_host: str = Field("127.0.0.1", description="Address the serving API listens on.")
    serving_port: Port = Field(8000, description="Port of the serving API, Triton's HTTP port.")
    serving_advertise: str = Field(
        "",
        description="The serving API's URL as the other nodes' serving services reach it (`model.ready`'s "
        "endpoint), e.g. http://10.0.0.7:8000; default: http://<serving host, or this host's name when it "
        "listens on every address>:<serving port>.",
    )
    node_name: str = Field(
        default_factory=socket.gethostname,
        description="The node whose serve jobs this service hosts: the executor's node name (default: hostname).",
    )
    tokens_file: Path | None = Field(
        None,
        description="The API's tokens file: inference takes the same bearer tokens (see the submit API).",
    )
    tokens: str = Field("", description="Inline tokens, as the API's: `token=tenant[:user][:admin],…`.")
    session_secret_file: Path | None = Field(
        None,
        description="The key of the dashboard's login sessions, the submit service's (the dashboard's inference "
        "form calls this entry point with its session cookie); default `<data dir>/secrets/session.key`.",
    )
    dashboard_origins: str = Field(
        "http://127.0.0.1:8080,http://localhost:8080",
        description="The dashboard's origins, comma-separated: their pages may call this entry point from the "
        "browser (CORS, with the session cookie); `gpuyard up` passes its own.",
    )
    retry_backoff: float = Field(
        5.0, description="Seconds before a serve job's first retry (the executor's setting, for serve jobs)."
    )
    event_concurrency: int = Field(16, description="Job events handled at once (those of one job in order).")
    serving_threads: int = Field(
        1, ge=1, description="ONNX Runtime intra-op threads of each session (CPU provider)."
    )
    max_batch_size: int = Field(
        0, ge=0, description="Dynamic batching: most requests merged into one run per model (0 or 1: off)."
    )
    max_queue_delay_us: int = Field(
        0, ge=0, description="Dynamic batching: microseconds a request may wait for others to join its batch."
    )
    max_request_bytes: Size = Field(
        64 * 1024 * 1024,
        gt=0,
        description="Largest request body the serving API reads, in bytes or with a unit (`256MiB`); default "
        "64 MiB, Triton's `--http-max-input-size`. A model's inputs give a tighter limit (`max_request_rows`); "
        "over it: 413, from `Content-Length` before the body is read.",
    )
    max_request_rows: int = Field(
        1024,
        ge=1,
        description="Most rows (the first dimension, when it is dynamic) one inference request may carry: more "
        "is a 413; with the model's inputs it bounds the request's body (docs/serving.md, \"Request limits\").",
    )

    @property
    def dashboard_origin_list(self) -> frozenset[str]:
        return frozenset(o.strip().rstrip("/") for o in self.dashboard_origins.split(",") if o.strip())

    @property
    def advertised_url(self) -> str:
        if self.serving_advertise:
            return self.serving_advertise.rstrip("/")
        host = self.serving_host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.serving_port}"
