"""`gpuyard context ls|use|rm`: the platforms this CLI knows (one context each, saved by `gpuyard up`, kept by
gpuyard/contexts.py) and the current one."""

from __future__ import annotations

import argparse

from rich.table import Table

from gpuyard import contexts
from gpuyard.cli.common import CliError, out, print_json
from gpuyard.shared.settings.client import ClientSettings


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """`context` takes no client options: it only reads and edits the saved contexts."""
    del common
    context = sub.add_parser(
        "context",
        help="the platforms this CLI knows (one context each, saved by `gpuyard up`) and the current one",
    )
    context_sub = context.add_subparsers(dest="action", required=True, metavar="ACTION")
    context_ls = context_sub.add_parser(
        "ls", help="each context: name, server, data dir; * marks the current one"
    )
    context_ls.add_argument("--json", action="store_true", help="machine-readable output")
    context_ls.set_defaults(func=cmd_context_ls)
    use = context_sub.add_parser("use", help="make a context the current one: commands talk to its platform")
    use.add_argument("name", metavar="NAME")
    use.set_defaults(func=cmd_context_use)
    forget = context_sub.add_parser("rm", help="forget a context (its platform and token stay as they are)")
    forget.add_argument("name", metavar="NAME")
    forget.set_defaults(func=cmd_context_rm)


def cmd_context_ls(args: argparse.Namespace) -> int:
    saved = contexts.load()
    if args.json:
        print_json(
            [
                {
                    "name": c.name,
                    "server": c.server,
                    "data_dir": c.data_dir or None,
                    "current": c.name == saved.current,
                }
                for c in saved.entries.values()
            ]
        )
        return 0
    if not saved.entries:
        out.print(
            f"no contexts in {contexts.config_path()}: `gpuyard up` saves one for each platform it runs"
        )
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("CURRENT", "NAME", "SERVER", "DATA DIR"):
        table.add_column(col, no_wrap=True)
    for c in saved.entries.values():
        table.add_row("*" if c.name == saved.current else "", c.name, c.server, c.data_dir or "(unknown)")
    out.print(table)
    chosen = ClientSettings().context
    if chosen and chosen != saved.current:
        out.print(f"GPUYARD_CONTEXT picks {chosen!r} for the commands of this shell")
    return 0


def cmd_context_use(args: argparse.Namespace) -> int:
    with contexts.editing() as saved:
        chosen = _context(saved, args.name)
        saved.current = chosen.name
    out.print(f"now talking to {chosen.server} (context {chosen.name!r})")
    return 0


def cmd_context_rm(args: argparse.Namespace) -> int:
    with contexts.editing() as saved:
        gone = saved.entries.pop(_context(saved, args.name).name)
        if saved.current == gone.name:
            saved.current = None
    out.print(
        f"forgot context {gone.name!r} ({gone.server}); its token stays valid on its platform until the next "
        "`gpuyard up` there replaces it"
        + ("; no context is current now: `gpuyard context use NAME`" if saved.current is None else "")
    )
    return 0


def _context(saved: contexts.Contexts, name: str) -> contexts.Context:
    try:
        picked = saved.pick(name)
    except contexts.ContextError as exc:
        raise CliError(str(exc)) from None
    if picked is None:  # (an empty name: the current context, and none is current)
        raise CliError(f"no context {name!r}: {contexts.LIST_THEM}")
    return picked
