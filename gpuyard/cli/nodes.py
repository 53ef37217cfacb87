"""The nodes and their GPUs: `gpuyard top` (a live view of them, drawn by gpuyard/top.py) and `gpuyard nodes`
(their state, each GPU's health, cordon and utilization; `nodes cordon|drain|uncordon` for admins)."""

from __future__ import annotations

import argparse

from rich.table import Table
from rich.text import Text

from gpuyard.cli.common import CliError, api_client, out, print_json
from gpuyard.shared.contracts.api.nodes import NodeOut
from gpuyard.top import run_top

NODE_STATE_STYLE = {"ready": "green", "lost": "red", "cordoned": "yellow", "draining": "yellow"}


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    top = sub.add_parser("top", help="a live view of the cluster's GPUs (like nvtop)", parents=[common])
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between two frames (2)")
    top.set_defaults(func=cmd_top)

    nodes = sub.add_parser(
        "nodes", help="the nodes: state, each GPU's health, cordon and utilization", parents=[common]
    )
    nodes.set_defaults(func=cmd_nodes)
    nodes_sub = nodes.add_subparsers(dest="action", required=False, metavar="ACTION")
    for action, text in (
        ("cordon", "place nothing new on a node or GPU; running jobs stay (admin)"),
        ("drain", "cordon, and stop and requeue the running jobs there (admin)"),
        ("uncordon", "undo a cordon or drain, and clear an unhealthy mark (admin)"),
    ):
        p = nodes_sub.add_parser(action, help=text, parents=[common])
        p.add_argument("target", metavar="NODE[/GPU]", help="a node, or one GPU of it by index (node-a/1)")
        p.add_argument("--reason", default="", help="why, recorded with the event")
        p.set_defaults(func=cmd_nodes_control)


def cmd_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise CliError("--interval must be more than 0 seconds")
    client = api_client(args)
    if args.json:
        print_json(client.nodes())
        return 0
    return run_top(client, out, interval=args.interval, once=args.once)


def cmd_nodes(args: argparse.Namespace) -> int:
    nodes = api_client(args).nodes()
    if args.json:
        print_json(nodes)
        return 0
    if not nodes:
        out.print("no nodes (no executor has announced one yet)")
        return 0
    print_nodes(nodes)
    return 0


def print_nodes(nodes: list[NodeOut]) -> None:
    """One row per GPU: the node's state on its first GPU's row, each GPU's health, cordon and utilization."""
    table = Table(box=None, pad_edge=False)
    for col in ("NODE", "STATE", "GPU", "MODEL", "HEALTH", "CORDON", "UTIL", "MEMORY", "HOLDERS"):
        table.add_column(col, no_wrap=col != "HEALTH", overflow="fold" if col == "HEALTH" else "ellipsis")
    for n in nodes:
        state = Text(n.state.value, style=NODE_STATE_STYLE.get(n.state.value, ""))
        if not n.gpus:
            table.add_row(n.node, state, "-", "", "", "", "", "", "")
        for k, g in enumerate(n.gpus):
            health = (
                Text("healthy", style="green")
                if g.healthy
                else Text(f"unhealthy: {g.unhealthy_reason or '?'}", style="bold red")
            )
            util = "-" if g.utilization_pct is None else f"{g.utilization_pct:.0f}%"
            memory = (
                "-"
                if g.memory_used_bytes is None
                else f"{g.memory_used_bytes / 2**30:.1f}/{g.memory_bytes / 2**30:.0f} GiB"
            )
            holders = ", ".join("other" if h.other else f"{h.job_id}" for h in g.holders) or "-"
            table.add_row(
                n.node if k == 0 else "",
                state if k == 0 else "",
                str(g.index),
                g.model,
                health,
                "cordoned" if g.cordoned else "-",
                util,
                memory,
                holders,
            )
    out.print(table)
    for n in nodes:
        for note in n.notes:
            out.print(f"{n.node}: {note}", markup=False, highlight=False)


# ---------------------------------------------------------------- cordon, drain, uncordon


def parse_node_target(target: str) -> tuple[str, int | None]:
    """`NODE` or `NODE/GPU` (a GPU's index), as `gpuyard nodes cordon|drain|uncordon` takes it."""
    node, slash, gpu = target.partition("/")
    if not node:
        raise CliError(f"{target!r}: expected NODE or NODE/GPU (e.g. node-a or node-a/1)")
    if not slash:
        return node, None
    if not gpu.isdigit():
        raise CliError(f"{target!r}: the GPU after '/' is its index, a number (e.g. node-a/1)")
    return node, int(gpu)


def cmd_nodes_control(args: argparse.Namespace) -> int:
    node, gpu = parse_node_target(args.target)
    done = api_client(args).node_control(node, args.action, gpu=gpu, reason=args.reason)
    if args.json:
        print_json(done)
        return 0
    what = f"node {node}" if gpu is None else f"GPU {gpu} of node {node}"
    verb = {"cordon": "cordoned", "drain": "drained", "uncordon": "uncordoned"}[args.action]
    follow = {
        "cordon": "nothing new is placed there; running jobs stay",
        "drain": "nothing new is placed there; its running jobs are stopped with their grace period and requeued",
        "uncordon": "open to new jobs again"
        + ("" if gpu is None else "; its unhealthy mark, if any, cleared"),
    }[args.action]
    out.print(f"{what} {verb}: {follow}")
    return 0
