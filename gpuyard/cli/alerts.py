"""`gpuyard alerts`: the alerts active now (and, with --all, the resolved ones), newest first."""

from __future__ import annotations

import argparse

from rich.table import Table
from rich.text import Text

from gpuyard.cli.common import age, api_client, out, print_json
from gpuyard.shared.contracts.api.alerts import AlertOut
from gpuyard.shared.contracts.events.alerts import AlertSeverity

SEVERITY_STYLE = {
    AlertSeverity.CRITICAL: "bold red",
    AlertSeverity.WARNING: "yellow",
    AlertSeverity.INFO: "cyan",
}


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    alerts = sub.add_parser(
        "alerts", help="alerts active now (--all: and resolved ones), newest first", parents=[common]
    )
    alerts.add_argument("-a", "--all", action="store_true", help="include resolved alerts")
    alerts.add_argument("--kind", help="only this rule's alerts: gpu_idle, gpu_temperature, node_lost…")
    alerts.add_argument("--tenant", help="only this tenant's (admins; a tenant's token sees its own)")
    alerts.add_argument("--limit", type=int, default=50, help="at most this many alerts (50)")
    alerts.set_defaults(func=cmd_alerts)


def cmd_alerts(args: argparse.Namespace) -> int:
    answer = api_client(args).alerts(
        state="all" if args.all else "active", kind=args.kind, tenant=args.tenant, limit=args.limit
    )
    alerts = answer.items
    if args.json:
        print_json(alerts)
        return 0
    if not alerts:
        out.print("no alerts" + ("" if args.all else " active (use --all to see resolved ones)"))
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("SEVERITY", "SINCE", "SUBJECT", "MESSAGE", *(["RESOLVED"] if args.all else [])):
        table.add_column(col, overflow="fold" if col == "MESSAGE" else "ellipsis", no_wrap=col != "MESSAGE")
    for a in alerts:
        row: list[str | Text] = [
            Text(a.severity.value, style=SEVERITY_STYLE.get(a.severity, "")),
            f"{age(a.raised_at)} ago",
            Text(alert_subject(a)),
            Text(a.message),
        ]
        if args.all:
            row.append(f"{age(a.resolved_at)} ago" if a.resolved_at else "active")
        table.add_row(*row)
    out.print(table)
    return 0


def alert_subject(alert: AlertOut) -> str:
    """What an alert is about, in a few words: 'node-1 GPU 3', 'job 4f2a… (vision)', 'node-2'."""
    parts = [alert.node or "", f"GPU {alert.gpu_index}" if alert.gpu_index is not None else ""]
    if alert.job_id:
        parts.append(f"job {alert.job_id}" + (f" ({alert.tenant})" if alert.tenant else ""))
    return " ".join(p for p in parts if p) or alert.alert_id
