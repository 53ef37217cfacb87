"""`gpuyard artifacts JOB [--download [PATH] [-o LOCAL]]`: what a job kept in its output folder
(GPUYARD_OUTPUT_DIR; docs/storage.md), listed whole or downloaded: a file as it is, a folder (all of it by
default) unpacked into a local folder."""

from __future__ import annotations

import argparse
from pathlib import Path
from urllib.parse import quote

from rich.table import Table

from gpuyard import transfers
from gpuyard.cli.common import CliError, age, api_client, out, print_json, transfer_progress
from gpuyard.cli.jobs import JOB_ARGUMENT
from gpuyard.client import Client
from gpuyard.shared.contracts.api.files import FileListOut, FileOut
from gpuyard.shared.contracts.units import format_size

MAX_LISTED = 10_000
"""The most entries `gpuyard artifacts JOB` lists (it says when there are more)."""


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    artifacts = sub.add_parser(
        "artifacts",
        help="list or download what a job kept in its output folder (GPUYARD_OUTPUT_DIR)",
        parents=[common],
    )
    artifacts.add_argument("job", help=JOB_ARGUMENT)
    artifacts.add_argument(
        "--download",
        nargs="?",
        const="",
        metavar="PATH",
        help="download a file or a folder of the outputs (all of them without PATH)",
    )
    artifacts.add_argument(
        "-o", "--output", metavar="LOCAL", help="with --download: where to put it (default: its name, here)"
    )
    artifacts.set_defaults(func=cmd_artifacts)


def cmd_artifacts(args: argparse.Namespace) -> int:
    if args.download is None:
        if args.output is not None:
            raise CliError("-o names where a download goes: give it with --download")
        return list_outputs(args)
    return download_outputs(args)


def _url(job: str, what: str = "") -> str:
    return f"/v1/jobs/{quote(job, safe='')}/artifacts{what}"


def walk(client: Client, job: str, limit: int = MAX_LISTED) -> tuple[list[FileOut], bool]:
    """Every file and folder the job kept, a listing of the API per folder, in the order of a tree (a folder
    before what it holds), at most `limit`; and whether there were more."""
    found: list[FileOut] = []
    folders, more = [""], False
    while folders and len(found) <= limit:
        listed = client.answer(FileListOut, "GET", _url(job), params={"path": folders.pop()})
        found += listed.items
        more = more or listed.truncated
        folders += [item.path for item in listed.items if item.kind == "dir"]
    found.sort(key=lambda item: item.path.split("/"))
    return found[:limit], more or bool(folders) or len(found) > limit


def list_outputs(args: argparse.Namespace) -> int:
    items, more = walk(api_client(args), args.job)
    if args.json:
        print_json(FileListOut(path="", items=items, truncated=more))
        return 0
    if not items:
        out.print(f"job {args.job} kept no outputs (what it writes to GPUYARD_OUTPUT_DIR is kept)")
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("PATH", "SIZE", "MODIFIED"):
        table.add_column(col, no_wrap=True)
    files = [i for i in items if i.kind == "file"]
    for i in items:
        size = format_size(i.size_bytes) if i.kind == "file" else "-"
        table.add_row(i.path + ("/" if i.kind == "dir" else ""), size, f"{age(i.modified_at)} ago")
    out.print(table)
    total = f"{len(files)} file(s), {format_size(sum(i.size_bytes for i in files))}"
    out.print(f"{total} (the first {len(items)} entries only)" if more else total)
    return 0


def download_outputs(args: argparse.Namespace) -> int:
    path = args.download.strip("/")
    path = "" if path == "." else path
    target = Path(args.output or (path.rpartition("/")[2] or f"{args.job}-outputs"))
    if target.exists():
        raise CliError(f"{target} exists: choose another place with -o")
    with transfer_progress(f"downloading {path or 'the outputs'} of job {args.job}", None) as advance:
        kind = transfers.download(
            api_client(args), _url(args.job, "/content"), {"path": path}, target, advance
        )
    if args.json:
        print_json({"job": args.job, "path": path, "kind": kind, "saved_to": str(target)})
    else:
        out.print(f"{'folder' if kind == 'dir' else 'file'} {args.job}:{path or '/'} -> {target}")
    return 0
