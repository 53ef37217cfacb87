"""`gpuyard admin`: platform administration. `admin tokens create|ls|revoke` ask the API (an admin token);
`admin backup`, `restore` and `bus-user` work on the platform's data directory, on its machine."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from rich.table import Table

from gpuyard.cli.common import CliError, api_client, err, out, platform_module, print_json, when
from gpuyard.shared.settings.common import CommonSettings

DATA_DIR_HELP = "the platform's data directory (default: GPUYARD_DATA_DIR or ~/.local/share/gpuyard)"
JSON_HELP = "machine-readable output"


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    admin = sub.add_parser("admin", help="platform administration (admin token)")
    admin_sub = admin.add_subparsers(dest="area", required=True, metavar="AREA")
    _add_tokens(admin_sub, common)

    save = admin_sub.add_parser(
        "backup", help="copy the stores, tokens and bus credentials to one archive, while the platform runs"
    )
    save.add_argument("archive", metavar="OUT.tar.gz")
    save.add_argument("--data-dir", help=DATA_DIR_HELP)
    save.add_argument("--json", action="store_true", help=JSON_HELP)
    save.set_defaults(func=cmd_backup)
    bus_user = admin_sub.add_parser(
        "bus-user", help="a read-only NATS user for one tenant's job events (for its integrations)"
    )
    bus_user.add_argument("--tenant", required=True, help="the tenant whose job events it may read")
    bus_user.add_argument("--data-dir", help=DATA_DIR_HELP)
    bus_user.add_argument("--json", action="store_true", help=JSON_HELP)
    bus_user.set_defaults(func=cmd_bus_user)
    load = admin_sub.add_parser("restore", help="unpack a backup into a new, empty data directory")
    load.add_argument("archive", metavar="IN.tar.gz")
    load.add_argument("--data-dir", required=True, help="the new data directory (empty or absent)")
    load.add_argument("--json", action="store_true", help=JSON_HELP)
    load.set_defaults(func=cmd_restore)


def _add_tokens(admin_sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    tokens = admin_sub.add_parser("tokens", help="create, list and revoke bearer tokens")
    tokens_sub = tokens.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = tokens_sub.add_parser("create", help="a new token, printed once", parents=[common])
    create.add_argument("--tenant", required=True)
    create.add_argument("--user", default="")
    create.add_argument("--admin", action="store_true", help="sees every tenant and manages tokens")
    expiry = create.add_mutually_exclusive_group()
    expiry.add_argument("--expires-in", metavar="DURATION", help="e.g. 30d, 12h, 3600")
    expiry.add_argument("--expires-at", metavar="TIME", help="ISO 8601 with its zone, e.g. 2027-01-31T00:00Z")
    create.set_defaults(func=cmd_tokens_create)
    tokens_sub.add_parser("ls", help="list tokens (never the tokens)", parents=[common]).set_defaults(
        func=cmd_tokens_ls
    )
    revoke = tokens_sub.add_parser("revoke", help="revoke a token by its id", parents=[common])
    revoke.add_argument("id")
    revoke.set_defaults(func=cmd_tokens_revoke)


# ---------------------------------------------------------------- tokens


def cmd_tokens_create(args: argparse.Namespace) -> int:
    created = api_client(args).create_token(
        tenant=args.tenant,
        user=args.user,
        admin=args.admin,
        expires_in=args.expires_in,
        expires_at=args.expires_at,
    )
    if args.json:
        print_json(created)
        return 0
    out.print(created.token)
    err.print(
        f"token {created.id} for {created.user or created.tenant} (tenant {created.tenant}"
        f"{', admin' if created.admin else ''}), expires {when(created.expires, 'never')}: "
        "shown this once, keep it now"
    )
    return 0


def cmd_tokens_ls(args: argparse.Namespace) -> int:
    tokens = api_client(args).tokens()
    if args.json:
        print_json(tokens)
        return 0
    table = Table(box=None, pad_edge=False)
    for column in ("ID", "TENANT", "USER", "ADMIN", "CREATED", "EXPIRES"):
        table.add_column(column)
    now = datetime.now(UTC)
    for t in tokens:
        expires = when(t.expires, "never")
        if t.expires is not None and t.expires <= now:
            expires += " (expired)"
        created = "settings" if t.inline else when(t.created, "-")
        table.add_row(t.id, t.tenant, t.user or "-", "yes" if t.admin else "", created, expires)
    out.print(table)
    return 0


def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    api_client(args).revoke_token(args.id)
    out.print(f"token {args.id} revoked")
    return 0


# ---------------------------------------------------------------- backup, restore, bus-user


def _data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir) if args.data_dir else CommonSettings().data_dir


def cmd_backup(args: argparse.Namespace) -> int:
    backup = platform_module("supervisor.backup", "backup")
    try:
        done = backup.backup(_data_dir(args), Path(args.archive))
    except backup.BackupError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print_json({"archive": args.archive, "files": done.files, "jobs": done.jobs, "events": done.events})
    else:
        out.print(
            f"backed up {done.jobs} jobs, {done.events} events ({', '.join(done.files)}) to {args.archive}"
        )
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    backup = platform_module("supervisor.backup", "restore")
    try:
        done = backup.restore(Path(args.archive), Path(args.data_dir))
    except backup.BackupError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print_json({"data_dir": args.data_dir, "files": done.files, "jobs": done.jobs, "events": done.events})
    else:
        out.print(
            f"restored {done.jobs} jobs, {done.events} events into {args.data_dir}; "
            f"start it with: gpuyard up --data-dir {args.data_dir}"
        )
    return 0


def cmd_bus_user(args: argparse.Namespace) -> int:
    busconfig = platform_module("supervisor.busconfig", "admin bus-user")
    try:
        made = busconfig.add_tenant_integrator(_data_dir(args), args.tenant)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print_json(
            {
                "tenant": made.tenant,
                "credentials": str(made.credentials),
                "config": str(made.config),
                "reloaded_pid": made.reloaded,
            }
        )
        return 0
    out.print(
        f"bus user for tenant {made.tenant}'s job events (job.*.{made.tenant}, read-only): {made.credentials}",
    )
    if made.reloaded is not None:
        out.print(f"the running NATS server (pid {made.reloaded}) reloaded {made.config}")
    else:
        out.print("no running NATS server: the user takes effect at the next `gpuyard up`")
    return 0
