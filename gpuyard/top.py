"""`gpuyard top`: a live view of the cluster's GPUs, like nvtop for the whole platform.

Each frame is one `GET /v1/nodes`: every node, each of its GPUs with a utilization bar, its memory and its
holders, from the node's latest `gpu.sample`. It refreshes in place (`rich.live.Live`) every `--interval`;
`--once` prints one frame and exits (for scripts and tests). Another tenant's job shows as `other`. Ctrl-C
stops it."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gpuyard.client import Client, ClientError
from gpuyard.shared.contracts.api.nodes import GpuHolderOut, GpuOut, NodeOut
from gpuyard.shared.contracts.units import format_size

BAR_WIDTH = 20
BUSY_PCT = 50.0
"""A GPU at or above this utilization is drawn busy (green); below, idle (yellow when held, dim when free)."""


def bar(pct: float | None, held: bool) -> Text:
    """A utilization bar with its figure: `████░░░░ 42%`."""
    if pct is None:
        return Text("no sample", style="dim")
    filled = round(max(0.0, min(100.0, pct)) / 100 * BAR_WIDTH)
    style = "green" if pct >= BUSY_PCT else "yellow" if held else "dim"
    text = Text("█" * filled, style=style)
    text.append("░" * (BAR_WIDTH - filled), style="dim")
    text.append(f" {pct:3.0f}%")
    return text


def holder_text(holders: list[GpuHolderOut]) -> Text:
    if not holders:
        return Text("-", style="dim")
    parts = []
    for h in holders:
        share = f" ×{h.fraction:g}" if h.fraction < 1 else ""
        parts.append("other" + share if h.other else f"{h.job_id} ({h.tenant}/{h.user}){share}")
    return Text(", ".join(parts))


def memory_text(gpu: GpuOut) -> str:
    if gpu.memory_used_bytes is None:
        return f"- / {format_size(gpu.memory_bytes)}"
    return f"{format_size(gpu.memory_used_bytes)} / {format_size(gpu.memory_bytes)}"


def frame(nodes: list[NodeOut], now: datetime | None = None) -> Group:
    """One view of the cluster: a headline and a row per GPU."""
    now = now or datetime.now(UTC)
    gpus = [g for n in nodes for g in n.gpus]
    busy = sum(1 for g in gpus if g.utilization_pct is not None and g.utilization_pct >= BUSY_PCT)
    held = sum(1 for g in gpus if g.holders)
    headline = Text(
        f"gpuyard top · {len(nodes)} node(s), {len(gpus)} GPU(s): {held} held, {busy} busy · "
        f"{now.strftime('%H:%M:%S')} UTC",
        style="bold",
    )
    table = Table(box=None, pad_edge=False)
    for column in ("NODE", "GPU", "MODEL", "UTILIZATION", "MEMORY", "HOLDER"):
        table.add_column(
            column, no_wrap=column != "HOLDER", overflow="fold" if column == "HOLDER" else "ellipsis"
        )
    for node in nodes:
        name = Text(node.node, style="red" if node.state == "lost" else "")
        if node.state == "lost":
            name.append(" (lost)")
        if not node.gpus:
            table.add_row(name, "-", "-", Text("no GPUs", style="dim"), "-", "-")
        for i, gpu in enumerate(node.gpus):
            table.add_row(
                name if i == 0 else "",
                str(gpu.index),
                gpu.model,
                bar(gpu.utilization_pct, bool(gpu.holders)),
                memory_text(gpu),
                holder_text(gpu.holders),
            )
    return Group(headline, table)


def run_top(client: Client, console: Console, *, interval: float, once: bool) -> int:
    if once:
        console.print(frame(client.nodes()))
        return 0
    with Live(frame(client.nodes()), console=console, auto_refresh=False, screen=False) as live:
        while True:
            time.sleep(interval)
            live.update(next_frame(client), refresh=True)


def next_frame(client: Client) -> Group | Text:
    """The next frame; the API away for a moment (a restart) is said in its place, and the next tries again."""
    try:
        return frame(client.nodes())
    except ClientError as exc:
        return Text(f"gpuyard top · {exc} (trying again)", style="red")
