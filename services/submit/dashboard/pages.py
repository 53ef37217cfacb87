"""The dashboard's pages: one entry each. A capability adds its page here (a path, a title, a script under
`static/pages/`) and the layout gives it the navigation, the session and the live event stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from gpuyard.services.submit.context import SubmitContext
from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN
from gpuyard.shared.contracts.jobspec import PRIORITY_CLASSES
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.reporting.usage import CSV_COLUMNS


@dataclass(frozen=True)
class Page:
    path: str
    """Its address; `{job_id}`-style parts are passed to the script as `data-*` attributes."""
    title: str
    script: str
    """The module under static/pages/ that renders it."""
    nav: str | None = None
    """Its link in the navigation; None for a page reached from another (a job's page)."""
    data: Callable[[SubmitContext], dict[str, str]] = field(default=lambda ctx: {})
    """Facts of the platform the script needs, as `data-*` attributes of the page (one definition of them)."""


def html_pattern(regex: str) -> str:
    """A name pattern of the contracts as an HTML `pattern` attribute: anchored already (the browser anchors it),
    and a `-` in a class escaped (the browser compiles it with the `v` flag, where a bare one is refused)."""
    return regex.removeprefix("^").removesuffix("$").replace("[-", "[\\-")


def _volumes_data(ctx: SubmitContext) -> dict[str, str]:
    return {"name_pattern": html_pattern(NAME_PATTERN), "default_size": format_size(ctx.volume_default_size)}


PAGES = (
    Page("/", "Cluster", "cluster.js", nav="Cluster"),
    Page("/jobs", "Jobs", "jobs.js", nav="Jobs"),
    Page("/jobs/{job_id}", "Job", "job.js"),
    Page(
        "/submit",
        "Submit a job",
        "submit.js",
        nav="Submit",
        data=lambda ctx: {"priorities": ",".join(PRIORITY_CLASSES)},
    ),
    Page("/models", "Models", "models.js", nav="Models", data=lambda ctx: {"serving_url": ctx.serving_url}),
    Page("/volumes", "Volumes", "volumes.js", nav="Volumes", data=_volumes_data),
    Page(
        "/alerts",
        "Alerts and usage",
        "alerts.js",
        nav="Alerts",
        data=lambda ctx: {"usage_columns": ",".join(CSV_COLUMNS)},
    ),
    Page("/tenants", "Tenants and quotas", "tenants.js", nav="Tenants"),
    Page("/nodes", "Nodes", "nodes.js", nav="Nodes"),
    Page("/environments", "Job environments", "environments.js", nav="Environments"),
    Page("/dev", "Dev environments", "dev.js", nav="Dev"),
)
NAV = tuple(p for p in PAGES if p.nav)
