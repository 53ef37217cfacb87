"""Who may read a /metrics that names tenants, jobs and users: one setting for the monitor, the serving entry point
and the submit API (its volume figures), read by `gpuyard.shared.auth.secretfile.ScrapeAuth`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from gpuyard.shared.settings.common import CommonSettings


class ScrapeSettings(CommonSettings):
    metrics_auth: Literal["token", "off"] = Field(
        "token",
        description="Who may read the figures of /metrics that name tenants, jobs and users (the monitor's GPUs, "
        "the serving entry point's models, the submit API's volumes): token (a scrape that carries the token of "
        "metrics_token_file, as a bearer token or as the basic-auth password; the monitor answers others 401, "
        "the serving entry point shows a tenant's own token or session its own models, the submit API leaves "
        "the volumes out) or off (anyone who reaches the address: only on one jobs cannot reach).",
    )
    metrics_token_file: Path | None = Field(
        None,
        description="The scrape token of /metrics (mode 0600), one for every service; default "
        "`<data dir>/secrets/metrics.token`, made at start. Prometheus sends it: `authorization: "
        "{credentials_file: …}` (deploy/prometheus/prometheus.yml).",
    )
