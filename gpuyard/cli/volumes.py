"""`gpuyard volumes create|ls|describe|upload|files|download|rm|delete`: a tenant's volumes of data, which jobs
mount (docs/storage.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from gpuyard import transfers
from gpuyard.cli.common import CliError, age, api_client, key_value_table, out, print_json, transfer_progress
from gpuyard.shared.contracts.api.files import FileListOut
from gpuyard.shared.contracts.api.volumes import (
    FilesDeletedOut,
    FilesWrittenOut,
    VolumeDeletedOut,
    VolumeListOut,
    VolumeOut,
)
from gpuyard.shared.contracts.units import format_size, parse_size


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    volumes = sub.add_parser("volumes", help="make, fill, list and delete volumes of data that jobs mount")
    actions = volumes.add_subparsers(dest="action", required=True, metavar="ACTION")
    owner = argparse.ArgumentParser(add_help=False)
    owner.add_argument(
        "--tenant", help="the tenant that owns the volume (default: your token's; another: admins)"
    )
    parents = [common, owner]
    create = actions.add_parser("create", help="make an empty volume", parents=parents)
    create.add_argument("name", metavar="NAME")
    create.add_argument("--size", help="what it may hold, e.g. 50GB (default: the platform's)")
    create.set_defaults(func=cmd_create)
    actions.add_parser("ls", help="your tenant's volumes", parents=parents).set_defaults(func=cmd_ls)
    describe = actions.add_parser(
        "describe", help="a volume's size, use and the jobs that mount it", parents=parents
    )
    describe.add_argument("name", metavar="NAME")
    describe.set_defaults(func=cmd_describe)
    upload = actions.add_parser("upload", help="copy a file or a folder into a volume", parents=parents)
    upload.add_argument("name", metavar="NAME")
    upload.add_argument("local", metavar="LOCAL_PATH", help="a file, or a folder (sent whole, as a tree)")
    upload.add_argument("--to", default="", metavar="DIR", help="the volume's folder to put it in (its top)")
    upload.set_defaults(func=cmd_upload)
    files = actions.add_parser("files", help="list a folder of a volume", parents=parents)
    files.add_argument("name", metavar="NAME")
    files.add_argument("path", metavar="PATH", nargs="?", default="")
    files.set_defaults(func=cmd_files)
    download = actions.add_parser("download", help="copy a file or a folder out of a volume", parents=parents)
    download.add_argument("name", metavar="NAME")
    download.add_argument("path", metavar="PATH", help="in the volume ('.' for all of it)")
    download.add_argument("-o", "--output", metavar="LOCAL", help="where to put it (default: its name, here)")
    download.set_defaults(func=cmd_download)
    rm = actions.add_parser("rm", help="remove a file or a folder from a volume", parents=parents)
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("path", metavar="PATH")
    rm.set_defaults(func=cmd_rm)
    delete = actions.add_parser("delete", help="delete a volume and its files", parents=parents)
    delete.add_argument("name", metavar="NAME")
    delete.set_defaults(func=cmd_delete)


def _params(args: argparse.Namespace, **more: object) -> dict:
    return {k: v for k, v in {"tenant": args.tenant, **more}.items() if v is not None}


def cmd_create(args: argparse.Namespace) -> int:
    body: dict[str, object] = {"name": args.name}
    if args.size is not None:
        try:
            body["size"] = parse_size(args.size)
        except ValueError as exc:
            raise CliError(f"--size: {exc}") from None
    volume = api_client(args).answer(VolumeOut, "POST", "/v1/volumes", json=body, params=_params(args))
    if args.json:
        print_json(volume)
    else:
        out.print(f"volume {volume.name} made ({format_size(volume.size_bytes)})")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    listed = api_client(args).answer(VolumeListOut, "GET", "/v1/volumes", params=_params(args))
    if args.json:
        print_json(listed)
        return 0
    if not listed.items:
        out.print("no volumes (make one: gpuyard volumes create NAME --size 50GB)")
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("NAME", "SIZE", "CREATED", "BY"):
        table.add_column(col, no_wrap=True)
    for v in listed.items:
        table.add_row(v.name, format_size(v.size_bytes), f"{age(v.created_at)} ago", v.created_by or "-")
    out.print(table)
    quota = format_size(listed.quota_bytes) if listed.quota_bytes else "no limit"
    out.print(f"{format_size(listed.reserved_bytes)} reserved of the tenant's volume quota ({quota})")
    return 0


def cmd_describe(args: argparse.Namespace) -> int:
    v = api_client(args).answer(VolumeOut, "GET", f"/v1/volumes/{args.name}", params=_params(args))
    if args.json:
        print_json(v)
        return 0
    used = v.used_bytes or 0
    rows = [
        ("Volume", f"{v.name} (tenant {v.tenant})"),
        ("Size", format_size(v.size_bytes)),
        ("Used", f"{format_size(used)} in {v.files or 0} files ({100 * used / v.size_bytes:.0f} %)"),
        ("Mounted by", ", ".join(v.mounted_by or []) or "no live job"),
        ("Created", f"{v.created_at.isoformat()} ({age(v.created_at)} ago) by {v.created_by or '-'}"),
    ]
    out.print(key_value_table(rows))
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    local = Path(args.local)
    if not local.exists():
        raise CliError(f"{args.local}: no such file or folder")
    to = args.to.strip("/")
    count, size = transfers.local_size(local)
    client = api_client(args)
    url = f"/v1/volumes/{args.name}/content"
    with transfer_progress(f"uploading {local.name}", size) as advance:
        if local.is_dir():
            chunks = transfers.tree_chunks(local, advance)
            params = _params(args, path=to, archive="true")
            answer = transfers.upload(client, url, params, chunks, "application/x-tar")
        else:
            params = _params(args, path=f"{to}/{local.name}" if to else local.name)
            answer = transfers.upload_file(client, url, params, local, "application/octet-stream", advance)
    written = FilesWrittenOut.model_validate(answer)
    if args.json:
        print_json(written)
    else:
        where = f"{to}/{local.name}" if to else local.name
        out.print(f"{written.files} file(s), {format_size(written.bytes)}, in {args.name}:{where}")
    return 0


def cmd_files(args: argparse.Namespace) -> int:
    listed = api_client(args).answer(
        FileListOut, "GET", f"/v1/volumes/{args.name}/files", params=_params(args, path=args.path)
    )
    if args.json:
        print_json(listed)
        return 0
    if not listed.items:
        out.print(f"{args.name}:{listed.path or '/'} is empty")
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("NAME", "SIZE", "MODIFIED"):
        table.add_column(col, no_wrap=True)
    for f in listed.items:
        name = f.path.rpartition("/")[2] + ("/" if f.kind == "dir" else "")
        table.add_row(
            name, format_size(f.size_bytes) if f.kind == "file" else "-", f"{age(f.modified_at)} ago"
        )
    out.print(table)
    if listed.truncated:
        out.print(f"(the first {len(listed.items)} entries only)")
    return 0


def cmd_download(args: argparse.Namespace) -> int:
    path = args.path.strip("/")
    path = "" if path == "." else path
    target = Path(args.output or (path.rpartition("/")[2] or args.name))
    if target.exists():
        raise CliError(f"{target} exists: choose another place with -o")
    client = api_client(args)
    with transfer_progress(f"downloading {path or args.name}", None) as advance:
        kind = transfers.download(
            client, f"/v1/volumes/{args.name}/content", _params(args, path=path), target, advance
        )
    if not args.json:
        out.print(f"{'folder' if kind == 'dir' else 'file'} {args.name}:{path or '/'} -> {target}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    done = api_client(args).answer(
        FilesDeletedOut, "DELETE", f"/v1/volumes/{args.name}/content", params=_params(args, path=args.path)
    )
    if args.json:
        print_json(done)
    else:
        out.print(f"removed {args.name}:{done.path} ({done.files} file(s), {format_size(done.bytes)})")
    return 0


def cmd_delete(args: argparse.Namespace) -> int:
    done = api_client(args).answer(
        VolumeDeletedOut, "DELETE", f"/v1/volumes/{args.name}", params=_params(args)
    )
    if args.json:
        print_json(done)
    else:
        out.print(f"volume {done.name} deleted ({format_size(done.freed_bytes)} freed)")
    return 0
