"""The Prometheus scrape configuration of one platform, with its scrape token: what `gpuyard up` writes in the
data dir beside `prometheus-targets.json`, so that a Prometheus pointed at it (`--config.file`) scrapes the
monitor's /metrics and every service's with the token they ask for.

The token travels as Prometheus's `authorization` (`type: Bearer`, `credentials_file`: Prometheus reads the
file at each scrape, so a new token needs no reload); the file, like the data dir, is the platform user's
(0600): run Prometheus as that user, or copy the token where it reads it. With `metrics_auth=off` no
`authorization` is written."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpuyard.shared.auth.secretfile import METRICS_TOKEN_FILE, ScrapeAuth
from gpuyard.shared.runtime.paths import write_private

SCRAPE_FILE = "prometheus.yml"
"""In the data dir: the scrape configuration (`write_scrape_config`)."""
INTERVAL = "5s"
"""The monitor samples every second; scraping every 5 s keeps the dashboards close to it."""
HEADER = (
    "# Prometheus scrape configuration of this GPUYARD platform, written by `gpuyard up` at each start\n"
    '# (docs/monitor.md, "What to scrape"): prometheus --config.file={path}\n'
)


def token_file(settings) -> Path | None:
    """The scrape token's file of a monitor's or serving's settings, made when missing; None with
    `metrics_auth=off`."""
    return ScrapeAuth.from_settings(settings).path


def scrape_config(monitor: str, targets_file: Path, token: Path | None) -> dict:
    """`monitor`: the monitor's /metrics as host:port; `targets_file`: the other services' (file_sd);
    `token`: the scrape token's file (None: no authorization)."""

    def authorization() -> dict:  # (one dict per job: YAML would write a shared one as an anchor)
        return {"authorization": {"type": "Bearer", "credentials_file": str(token)}} if token else {}

    return {
        "global": {"scrape_interval": INTERVAL, "evaluation_interval": "15s"},
        "scrape_configs": [
            {
                "job_name": "gpuyard-monitor",
                "metrics_path": "/metrics",
                **authorization(),
                "static_configs": [{"targets": [monitor]}],
            },
            {
                "job_name": "gpuyard-services",
                "metrics_path": "/metrics",
                **authorization(),
                "file_sd_configs": [{"files": [str(targets_file)]}],
            },
        ],
    }


def write_scrape_config(data_dir: Path, monitor: str, targets_file: Path, token: Path | None) -> Path:
    """`<data dir>/prometheus.yml` (0600), replaced whole."""
    path = Path(data_dir) / SCRAPE_FILE
    text = HEADER.format(path=path) + yaml.safe_dump(
        scrape_config(monitor, targets_file, token), sort_keys=False
    )
    write_private(path, text)
    return path


__all__ = ["METRICS_TOKEN_FILE", "SCRAPE_FILE", "scrape_config", "token_file", "write_scrape_config"]
