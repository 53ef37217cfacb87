"""`gpuyard sim`: replay a trace through the scheduling core, one result row per policy.

    python -m gpuyard.shared.scheduling.sim --trace FILE --policy NAME[,NAME...] [--mode inflation|time] [--seeds N]
                                     [--nodes FILE] [--json] [--plot FILE.png]

This module is the whole simulator command line: `gpuyard sim ARGS` runs `python -m gpuyard.shared.scheduling.sim
ARGS` (the client package imports no service). The FIFO/first-fit baseline ("fifo") is always included. An
argument that cannot work is one line on stderr and exit status 2; `--plot` needs matplotlib, the optional
extra `sim` (the error names the pip command that adds it to this installation: `shared/runtime/installhint.py`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from gpuyard.shared.runtime.installhint import install_command
from gpuyard.shared.scheduling.sim import presets
from gpuyard.shared.scheduling.sim.trace import DEFAULT_NODES, DEFAULT_PODS, SHIPPED, read_nodes, read_pods

PROG = "gpuyard sim"
PLOT_SUFFIXES = (".png", ".svg", ".pdf")
POSITIVE = {"seeds": "--seeds", "ratio": "--ratio", "speedup": "--speedup", "limit_factor": "--limit-factor"}
PUBLISHED_AT_100 = {  # FGD paper / artifact, mean unallocated GPUs (%) at arrived = 100%: BestFit, FGD
    "openb_pod_list_default": (7.14, 4.77),
    "openb_pod_list_gpushare40": (8.56, 6.04),
    "openb_pod_list_multigpu20": (6.27, 4.47),
    "openb_pod_list_gpuspec33": (19.61, 12.16),
    "openb_pod_list_cpu050": (6.44, 5.00),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    shipped = f"shipped with gpuyard: {', '.join(SHIPPED)}; any other name is a path"
    parser.add_argument("--trace", default=DEFAULT_PODS, help=f"pod CSV (openb columns); {shipped}")
    parser.add_argument("--nodes", default=DEFAULT_NODES, help=f"node CSV (openb columns); {shipped}")
    parser.add_argument(
        "--policy",
        default="firstfit,bestfit,fgd,gpuyard",
        help=f"comma-separated, from {', '.join(presets.names())}; 'fifo' (the baseline) is always added",
    )
    parser.add_argument("--mode", choices=["inflation", "time"], default="inflation")
    parser.add_argument("--seeds", type=int, default=10, help="inflation: seeds 42, 43, ... (mean reported)")
    parser.add_argument(
        "--ratio", type=float, default=1.3, help="inflation: arrived demand to reach, x capacity"
    )
    parser.add_argument("--speedup", type=float, default=1.0, help="time: divide arrival times by this")
    parser.add_argument("--limit-factor", type=float, default=1.0, help="time: time limit = runtime x this")
    parser.add_argument(
        "--cluster-fraction",
        type=float,
        default=1.0,
        help="time: keep every (1/F)-th node (a smaller cluster)",
    )
    parser.add_argument("--json", action="store_true", help="print machine-readable results on stdout")
    parser.add_argument(
        "--plot", type=Path, help="write a PNG (inflation: unallocated vs arrived; time: timeline)"
    )


def argument_error(args: argparse.Namespace) -> str | None:
    """Why these arguments cannot work, found before any trace is read; None when they can."""
    for field, flag in POSITIVE.items():
        value = getattr(args, field)
        if value <= 0:
            return f"{flag} must be positive, not {value:g}"
    if not 0 < args.cluster_fraction <= 1:
        return f"--cluster-fraction must be in (0, 1], not {args.cluster_fraction:g}"
    if args.plot is not None:
        folder = args.plot.resolve().parent
        if not folder.is_dir():
            return f"--plot {args.plot}: folder {folder} does not exist"
        if args.plot.suffix.lower() not in PLOT_SUFFIXES:
            return f"--plot {args.plot}: the file name must end in {', '.join(PLOT_SUFFIXES)}"
        try:
            import matplotlib  # noqa: F401  (the optional extra `sim`)
        except ImportError:
            return plot_needs()
    return None


def plot_needs() -> str:
    return f"--plot needs matplotlib: {install_command('sim')}"


def fail(message: str) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    error = argument_error(args)
    if error is not None:
        return fail(error)
    try:
        nodes = read_nodes(args.nodes)
        pods = read_pods(args.trace)
        names = _policies(args.policy)
    except (FileNotFoundError, ValueError, KeyError) as e:
        return fail(str(e))
    except OSError as e:  # a folder or an unreadable file given as a trace
        return fail(f"cannot read {e.filename}: {e.strerror or e}" if e.filename else str(e))
    if args.mode == "time" and args.cluster_fraction < 1:
        nodes = _subsample(nodes, args.cluster_fraction)
    try:
        if args.mode == "inflation":
            results = _inflation(nodes, pods, names, args)
        else:
            results = _time(nodes, pods, names, args)
    except ValueError as e:
        return fail(str(e))
    if args.json:
        print(json.dumps(results, indent=2))
    if args.plot:
        _plot(results, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Replay a cluster trace (openb CSV columns) through the scheduling core and compare "
        "placement policies; the table goes to stderr, --json to stdout.",
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


# ------------------------------------------------------------------------------------------------ helpers
def _policies(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    for n in names:
        presets.config_for(n)  # raises ValueError for unknown names
    if presets.BASELINE not in names:
        names.insert(0, presets.BASELINE)
    return list(dict.fromkeys(names))


def _subsample(nodes, fraction: float):
    from gpuyard.shared.scheduling.sim.trace import NodeTable

    step = max(1, round(1 / fraction))
    keep = np.arange(0, len(nodes.names), step)
    return NodeTable(
        [nodes.names[i] for i in keep],
        nodes.cpus[keep],
        nodes.memory[keep],
        nodes.gpus[keep],
        [nodes.models[i] for i in keep],
    )


class LineProgress:
    """Progress as plain lines on stderr, when it is not a terminal (a log, CI, a pipe): one line at each tenth
    of the work and at least every 10 s, instead of a bar nobody sees."""

    def __init__(self, stream=None, every: float = 10.0):
        self.stream, self.every = stream or sys.stderr, every
        self.total, self.done, self.description = 0, 0, ""
        self.started = self.said = time.monotonic()
        self.tenth = 0

    def __enter__(self) -> LineProgress:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def add_task(self, description: str, total: int) -> int:
        self.description, self.total = description, total
        return 0

    def update(self, task: int, description: str) -> None:
        self.description = description

    def advance(self, task: int, amount: int) -> None:
        self.done += amount
        now = time.monotonic()
        tenth = int(10 * self.done / self.total) if self.total else 0
        if tenth > self.tenth or now - self.said >= self.every:
            self.tenth, self.said = tenth, now
            share = 100 * self.done / self.total if self.total else 0
            print(
                f"{self.description}: {share:.0f}% ({self.done}/{self.total}), {now - self.started:.0f} s",
                file=self.stream,
                flush=True,
            )


def _progress(total: int, description: str):
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    if not sys.stderr.isatty():
        return LineProgress()
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )


def _inflation(nodes, pods, names: list[str], args: argparse.Namespace) -> dict:
    from gpuyard.shared.scheduling.sim.inflation import GRID, InflationSummary, draw_workload, run_inflation

    seeds = list(range(42, 42 + max(1, args.seeds)))
    per_run = len(draw_workload(pods, nodes.total_gpus * 1000, seeds[0], args.ratio))
    summaries = {n: InflationSummary(n) for n in names}
    with _progress(0, "") as progress:
        task = progress.add_task("inflation", total=per_run * len(seeds) * len(names))
        for name in names:
            for seed in seeds:
                progress.update(task, description=f"{name} seed {seed}")
                run = run_inflation(
                    nodes,
                    pods,
                    presets.placement_for(name),
                    seed,
                    args.ratio,
                    lambda k: progress.advance(task, k),
                )
                run.policy = name
                summaries[name].runs.append(run)
    trace = Path(args.trace).stem
    published = PUBLISHED_AT_100.get(trace)
    _inflation_table(summaries, trace, published)
    return {
        "mode": "inflation",
        "trace": str(args.trace),
        "nodes": str(args.nodes),
        "gpus": int(nodes.total_gpus),
        "seeds": seeds,
        "published_at_100": {"bestfit": published[0], "fgd": published[1]} if published else None,
        "arrived_pct": GRID.tolist(),
        "policies": {
            n: {
                "unallocated_at_100_pct": s.mean_at_100,
                "std_at_100": s.std_at_100,
                "failed_pods_mean": float(np.mean([r.failed for r in s.runs])),
                "pods_mean": float(np.mean([r.pods for r in s.runs])),
                "unallocated_curve_pct": [round(float(x), 4) for x in s.mean_curve],
                "seconds": float(sum(r.seconds for r in s.runs)),
            }
            for n, s in summaries.items()
        },
    }


def _inflation_table(summaries, trace: str, published) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"inflation replay of {trace} (unallocated GPUs, % of capacity; lower is better)")
    for col in ("policy", "@100% arrived", "±std", "@110%", "@130%", "failed pods", "seconds"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    for name, s in summaries.items():
        curve = s.mean_curve
        table.add_row(
            name,
            f"{s.mean_at_100:.2f}",
            f"{s.std_at_100:.2f}",
            f"{curve[110]:.2f}",
            f"{curve[130]:.2f}",
            f"{np.mean([r.failed for r in s.runs]):.0f}",
            f"{sum(r.seconds for r in s.runs):.1f}",
        )
    if published:
        table.caption = f"published (FGD paper, 10 seeds): BestFit {published[0]:.2f}, FGD {published[1]:.2f}"
    Console(stderr=True).print(table)


def _time(nodes, pods, names: list[str], args: argparse.Namespace) -> dict:
    from gpuyard.shared.scheduling.sim.cluster import popularity
    from gpuyard.shared.scheduling.sim.timemode import run_time

    shapes = popularity(pods)
    runs = {}
    with _progress(0, "") as progress:
        task = progress.add_task("time", total=len(pods) * len(names))
        for name in names:
            progress.update(task, description=f"{name}")
            runs[name] = run_time(
                nodes,
                pods,
                name,
                presets.config_for(name, shapes),
                args.limit_factor,
                args.speedup,
                lambda k: progress.advance(task, k),
            )
    _time_table(runs, Path(args.trace).stem)
    return {
        "mode": "time",
        "trace": str(args.trace),
        "nodes": str(args.nodes),
        "gpus": int(nodes.total_gpus),
        "speedup": args.speedup,
        "limit_factor": args.limit_factor,
        "policies": {n: {**r.summary(), "timeline": r.timeline} for n, r in runs.items()},
    }


def _time_table(runs, trace: str) -> None:
    """Two tables, each narrow enough for an 80-column terminal: what the jobs took and the cluster held, then
    how long they waited (the tail too: one policy can win the mean and lose the 99th percentile)."""
    from rich.console import Console
    from rich.table import Table

    from gpuyard.shared.contracts.units import format_rough_duration as duration

    def d(v):
        return "-" if v is None else duration(v)

    summaries = {name: r.summary() for name, r in runs.items()}
    tables = (
        (
            f"time replay of {trace}: jobs and GPUs",
            {
                "avg JCT": lambda s: d(s["avg_jct_s"]),
                "median JCT": lambda s: d(s["median_jct_s"]),
                "p95 JCT": lambda s: d(s["p95_jct_s"]),
                "never ran": lambda s: str(s["never_started"]),
                "GPU alloc %": lambda s: f"{s['gpu_allocation_mean_pct']:.1f}",
                "makespan": lambda s: d(s["makespan_s"]),
            },
        ),
        (
            f"time replay of {trace}: waits",
            {
                "avg": lambda s: d(s["avg_wait_s"]),
                "p95": lambda s: d(s["p95_wait_s"]),
                "p99": lambda s: d(s["p99_wait_s"]),
                "p99.9": lambda s: d(s["p99_9_wait_s"]),
                "longest": lambda s: d(s["longest_wait_s"]),
                "over 1 h": lambda s: str(s["waits_over_1h"]),
            },
        ),
    )
    console = Console(stderr=True)
    for title, cells in tables:
        table = Table(title=title)
        table.add_column("policy")
        for column in cells:
            table.add_column(column, justify="right")
        for name, s in summaries.items():
            table.add_row(name, *(cell(s) for cell in cells.values()))
        console.print(table)
    console.print("GPU alloc %: the GPUs allocated over the arrivals' window (1st to 99th percentile).")


def activity_window(results: dict) -> tuple[float, float]:
    """A time replay's activity, in seconds of the replay's clock: from the first arrival to the last arrival
    or the last start, whichever is later, over every policy. Past it the cluster only empties, as the
    longest jobs run out (on the openb default file at --speedup 20: 180 h of arrivals, 3,500 h of tail)."""
    summaries = results["policies"].values()
    start = min(s["first_arrival_s"] for s in summaries)
    end = max(max(s["last_arrival_s"], s["last_start_s"]) for s in summaries)
    return start, max(end, start + 1.0)


def figure(results: dict):
    """The plot of a replay: inflation, unallocated GPUs against arrived demand; time, GPUs allocated and jobs
    waiting over the activity window (`activity_window`, plus 5%), in hours since the first arrival."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if results["mode"] == "inflation":
        fig, ax = plt.subplots(figsize=(7, 4.5))
        x = results["arrived_pct"]
        for name, r in results["policies"].items():
            ax.plot(x, r["unallocated_curve_pct"], label=f"{name} ({r['unallocated_at_100_pct']:.2f}% @100)")
        ax.set_xlabel("arrived GPU demand (% of capacity)")
        ax.set_ylabel("unallocated GPUs (%)")
        ax.set_xlim(80, 130)
        ax.set_ylim(0, 25)
        ax.axvline(100, color="grey", lw=0.5)
        ax.set_title(Path(results["trace"]).stem)
        ax.legend()
        return fig
    start, end = activity_window(results)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    last = start
    for name, r in results["policies"].items():
        t = np.asarray(r["timeline"]["t"], dtype=float)
        last = max(last, float(t.max(initial=start)))
        top.plot((t - start) / 3600.0, r["timeline"]["allocated_pct"], label=name, lw=0.8)
        bottom.plot((t - start) / 3600.0, r["timeline"]["queue"], label=name, lw=0.8)
    shown = (end - start) * 1.05
    bottom.set_xlim(0, shown / 3600.0)
    top.set_ylabel("GPUs allocated (%)")
    bottom.set_ylabel("jobs waiting")
    label = "hours since the first arrival"
    if last - start > shown:
        label += f" (arrivals and starts end at {(end - start) / 3600:,.0f} h; jobs run out until {(last - start) / 3600:,.0f} h)"
    bottom.set_xlabel(label)
    top.legend()
    top.set_title(Path(results["trace"]).stem)
    return fig


def _plot(results: dict, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig = figure(results)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote the plot to {path}", file=sys.stderr)
    plt.close(fig)
