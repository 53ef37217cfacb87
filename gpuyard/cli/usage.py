"""`gpuyard usage`: GPU-hours allocated, used and wasted, per tenant, user or job (a table, CSV or JSON); with
`--volumes`, the storage of a tenant's volumes besides: each one's size and use, what they reserve of the
tenant's volume quota.

The volumes are one tenant's, the caller's (an admin names another with `--tenant`): the API lists a tenant's
volumes (`GET /v1/volumes`, with its quota and what they reserve) and describes each (its use), and has no
view of every tenant's."""

from __future__ import annotations

import argparse
import csv
import sys

from rich.table import Table

from gpuyard.cli.common import CliError, api_client, out, print_json
from gpuyard.client import Client
from gpuyard.shared.contracts.api.usage import UsageOut
from gpuyard.shared.contracts.api.volumes import VolumeListOut, VolumeOut
from gpuyard.shared.contracts.units import format_size
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
    usage.add_argument(
        "--volumes",
        action="store_true",
        help="also the storage of your tenant's volumes (an admin's --tenant: that tenant's): size, use, quota",
    )
    usage.set_defaults(func=cmd_usage)


def cmd_usage(args: argparse.Namespace) -> int:
    if args.volumes and args.csv:
        raise CliError("--volumes has no CSV form: leave out --csv (or --volumes)")
    client = api_client(args)
    answer = client.usage(since=args.since, by=args.by, tenant=args.tenant)
    volumes = tenant_volumes(client, args.tenant) if args.volumes else None
    if args.json:
        if volumes is None:
            print_json(answer)
        else:  # (both in one document)
            print_json({"gpu": answer.model_dump(mode="json"), "volumes": volumes.model_dump(mode="json")})
        return 0
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for r in answer.rows:
            writer.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in CSV_COLUMNS])
        return 0
    print_usage(answer)
    if volumes is not None:
        print_volumes(volumes)
    return 0


def tenant_volumes(client: Client, tenant: str | None) -> VolumeListOut:
    """The tenant's volumes (the caller's: None), each as described, with its use."""
    params = {"tenant": tenant} if tenant else {}
    listed = client.answer(VolumeListOut, "GET", "/v1/volumes", params=params)
    described = [
        client.answer(VolumeOut, "GET", f"/v1/volumes/{v.name}", params=params) for v in listed.items
    ]
    return listed.model_copy(update={"items": described})


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


def print_volumes(listed: VolumeListOut) -> None:
    """The tenant's volumes: each one's size and use, then what they reserve of its quota and hold."""
    quota = (
        f"of its volume quota ({format_size(listed.quota_bytes)})"
        if listed.quota_bytes
        else "(no volume quota)"
    )
    out.print()
    if not listed.items:
        out.print(f"no volumes {quota} (make one: gpuyard volumes create NAME --size 50GB)")
        return
    table = Table(
        box=None, pad_edge=False, title=f"Volumes of tenant {listed.items[0].tenant}", title_justify="left"
    )
    for col in ("VOLUME", "SIZE", "USED", "USED %"):
        table.add_column(col, justify="left" if col == "VOLUME" else "right", no_wrap=True)
    for v in listed.items:
        used = v.used_bytes or 0
        table.add_row(
            v.name, format_size(v.size_bytes), format_size(used), f"{100 * used / v.size_bytes:.0f}%"
        )
    out.print(table)
    held = sum(v.used_bytes or 0 for v in listed.items)
    out.print(
        f"{len(listed.items)} volume(s) reserve {format_size(listed.reserved_bytes)} {quota}; "
        f"their files hold {format_size(held)}"
    )
