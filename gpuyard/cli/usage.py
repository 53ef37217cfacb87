"""`gpuyard usage`: GPU-hours allocated, used and wasted, per tenant, user or job (a table, CSV or JSON)."""

from __future__ import annotations

import argparse
import csv
import sys

from rich.table import Table

from gpuyard.cli.common import api_client, out, print_json
from gpuyard.shared.contracts.api.usage import UsageOut
from gpuyard.shared.reporting.usage import CSV_COLUMNS


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    usage = sub.add_parser(
        "usage", help="GPU-hours allocated, used and wasted, per tenant, user or job", parents=[common]
    )
    usage.add_argument("--since", default="7d", help="how far back: 7d, 24h, 90m (7d)")
    usage.add_argument(
        "--by", choices=("tenant", "user", "job"), default="tenant", help="one row per (tenant)"
    )
    usage.add_argument("--tenant", help="only this tenant's (admins; a tenant's token sees its own)")
    usage.add_argument("--csv", action="store_true", help="CSV, one row per line, for a spreadsheet")
    usage.set_defaults(func=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    answer = api_client(args).usage(since=args.since, by=args.by, tenant=args.tenant)
    if args.json:
        print_json(answer)
        return 0
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for r in answer.rows:
            writer.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in CSV_COLUMNS])
        return 0
    print_usage(answer)
    return 0


def print_usage(answer: UsageOut) -> None:
    window = f"{answer.since:%Y-%m-%d %H:%M} to {answer.until:%Y-%m-%d %H:%M} UTC"
    if not answer.rows:
        out.print(f"no GPU use from {window}")
        return
    keys = {"tenant": ["TENANT"], "user": ["TENANT", "USER"], "job": ["TENANT", "USER", "JOB"]}[answer.by]
    table = Table(box=None, pad_edge=False, title=f"GPU-hours from {window}", title_justify="left")
    for col in (*keys, "JOBS", "ALLOCATED", "USED", "WASTE", "USED %"):
        table.add_column(col, justify="right" if col not in keys else "left", no_wrap=True)
    for r in answer.rows:
        share = f"{100 * r.used_gpu_hours / r.allocated_gpu_hours:.0f}%" if r.allocated_gpu_hours else "-"
        key = [r.tenant, r.user or "", r.job_id or ""][: len(keys)]
        table.add_row(
            *key,
            str(r.jobs),
            f"{r.allocated_gpu_hours:.2f}",
            f"{r.used_gpu_hours:.2f}",
            f"{r.waste_gpu_hours:.2f}",
            share,
        )
    out.print(table)
