"""The Prometheus scrape configuration of one platform, with its scrape token: what `gpuyard up` writes in the
data dir beside `prometheus-targets.json` (each service's /metrics address but the monitor's, in Prometheus's
file_sd format: `write_metrics_targets`), so that a Prometheus pointed at it (`--config.file`) scrapes the
monitor's /metrics and every service's with the token they ask for.

The token travels as Prometheus's `authorization` (`type: Bearer`, `credentials_file`: Prometheus reads the
file at each scrape, so a new token needs no reload); the file, like the data dir, is the platform user's
(0600): run Prometheus as that user, or copy the token where it reads it. With `metrics_auth=off` no
`authorization` is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from gpuyard.shared.auth.secretfile import METRICS_TOKEN_FILE, ScrapeAuth, SecretFileError
from gpuyard.shared.runtime.paths import write_private
from gpuyard.supervisor.ports import loopback_for

if TYPE_CHECKING:
    from gpuyard.supervisor.plan import Plan

TARGETS_FILE = "prometheus-targets.json"
"""In the data dir: each service's /metrics address but the monitor's, in Prometheus's file_sd format."""
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


def write_metrics_targets(platform: Plan) -> Path:
    """`<data dir>/prometheus-targets.json`, replaced whole (Prometheus re-reads a file_sd file that changes)."""
    path = platform.data_dir / TARGETS_FILE
    partial = path.with_suffix(".json.partial")
    partial.write_text(json.dumps(platform.metrics_targets(), indent=2) + "\n")
    partial.replace(path)
    return path


def write_prometheus_files(platform: Plan) -> tuple[Path, Path | None]:
    """The targets file, and with a monitor the scrape token (0600, unless metrics_auth=off) and a scrape
    configuration that sends it: (the targets file, the scrape configuration or None)."""
    targets_path = write_metrics_targets(platform)
    monitor = platform.monitor
    if monitor is None:
        return targets_path, None
    try:
        scrape = write_scrape_config(
            platform.data_dir,
            f"{loopback_for(monitor.metrics_host)}:{monitor.metrics_port}",
            targets_path,
            token_file(monitor),
        )
    except (OSError, SecretFileError) as exc:
        raise SystemExit(f"the metrics scrape token: {exc}") from None
    return targets_path, scrape


__all__ = [
    "METRICS_TOKEN_FILE",
    "SCRAPE_FILE",
    "TARGETS_FILE",
    "scrape_config",
    "token_file",
    "write_metrics_targets",
    "write_prometheus_files",
    "write_scrape_config",
]
