"""What `gpuyard up` says once the platform is up: where its API, dashboard, data dir and metrics are, its admin
token and the CLI's context that holds it, whose rights jobs run with, and how to type the CLI here."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

from rich.markup import escape

from gpuyard.shared.runtime.paths import PLATFORM_PYTHON_CLOSED, unreachable_to_others
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.supervisor.datadir import Prepared
from gpuyard.supervisor.plan import Plan


def banner(platform: Plan, ready: Prepared) -> str:
    """The lines said once every service started and the API answers (rich markup)."""
    url = ready.server_url
    lines = [
        f"\n[bold green]GPUYARD is up.[/] API {url} (OpenAPI at {url}/docs)",
        f"  dashboard   {url}/  (log in with the admin token below)",
        f"  data dir    {platform.data_dir}",
        f"  admin token {ready.admin_token}  (saved for the CLI in {ready.config_path} as context "
        f"{ready.context.name!r}, now the current one; `gpuyard context ls` lists every context)",
        f"  scheduler   policy {platform.settings_of('scheduler', SchedulerSettings).policy}",
    ]
    executor = platform.executor
    if executor.simulate_gpus:
        lines.append(f"  GPUs        {executor.simulate_gpus} simulated on node {executor.node_name}")
    lines.append(f"  metrics     {metrics_line(platform)}  (Prometheus file_sd: {ready.targets_path})")
    if ready.scrape is not None:
        lines.append(f"  Prometheus  prometheus --config.file={ready.scrape}  (it sends the scrape token)")
    lines += job_rights(os.geteuid() == 0, executor.job_users)
    cli = cli_command()
    lines.append(
        f"  Try: {cli} submit examples/hello.yaml --follow  ·  {cli} ps  ·  Ctrl-C stops everything\n"
    )
    return "\n".join(lines)


def job_rights(root: bool, job_users: str) -> list[str]:
    """The banner's lines on whose rights jobs run with: the platform's own (not root, or tenants that
    GPUYARD_JOB_USERS maps to `platform`: then root's), else unprivileged users'."""
    if not root:
        return [
            "  [bold yellow]jobs share this platform's rights[/]: they run as its own user and can read its data "
            "dir (tokens, event store, other jobs' logs); run it as root to run jobs as unprivileged users "
            "(GPUYARD_JOB_USERS)"
        ]
    pairs = [
        [part.strip() for part in item.partition("=")[::2]] for item in job_users.split(",") if "=" in item
    ]
    own = [tenant for tenant, user in pairs if user == "platform"]
    lines = []
    if "*" in own:
        others = [tenant for tenant, user in pairs if user != "platform"]
        lines.append(_every_tenant_as_root(job_users, others))
        if not others:
            return lines
    elif own:
        lines.append(
            f"  [bold yellow]jobs of {', '.join(own)} run as root[/], with this platform's rights "
            "(`platform` in GPUYARD_JOB_USERS); the other tenants' run as unprivileged users"
        )
    else:
        lines.append("  jobs        run as unprivileged users, one per tenant (GPUYARD_JOB_USERS)")
    if (closed := unreachable_to_others(Path(sys.executable))) is not None:
        warning = PLATFORM_PYTHON_CLOSED.format(python=sys.executable, closed=closed)
        lines.append(f"  [bold yellow]{warning}[/]")
    return lines


def _every_tenant_as_root(job_users: str, others: list[str]) -> str:
    """The line for GPUYARD_JOB_USERS mapping every tenant (`*`) to `platform`, but `others`."""
    who = f"jobs of every tenant but {', '.join(others)}" if others else "jobs"
    demo = " (as `make demo` sets it)" if job_users.replace(" ", "") == "*=platform" else ""
    return (
        f"  [bold yellow]{who} run as root[/], this platform's own user: GPUYARD_JOB_USERS="
        f"{escape(job_users)!r}{demo} gives them its rights, over its data dir and the whole machine; unset "
        "it to run each tenant's jobs as an unprivileged user of its own"
    )


def metrics_line(platform: Plan) -> str:
    """Where each service's /metrics is: `submit 127.0.0.1:8080 · scheduler 127.0.0.1:41001 · …`."""
    parts = [f"{t['labels']['process']} {t['targets'][0]}" for t in platform.metrics_targets()]
    monitor = platform.monitor
    if monitor is not None:
        parts.append(f"monitor {monitor.metrics_host}:{monitor.metrics_port}")
    return " · ".join(parts)


def cli_command() -> str:
    """How to type the CLI in this shell: `gpuyard` when it is this installation's on the PATH, else its
    path (relative to here when it is below, as `.venv/bin/gpuyard` after `make demo`)."""
    mine = Path(sys.executable).parent / "gpuyard"
    found = shutil.which("gpuyard")
    if found and Path(found).resolve() == mine.resolve():
        return "gpuyard"
    with contextlib.suppress(ValueError):
        return str(mine.relative_to(Path.cwd()))
    return str(mine)
