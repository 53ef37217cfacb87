"""Run a benchmark several times, interleaved across versions of the code, and report min / median / max of the
figures it prints: the way every throughput figure in docs/benchmarks.md is taken.

    # five rounds of this tree's pipeline benchmark
    python benchmarks/rounds.py --runs 5 --field end_to_end_jobs_per_s --field cpu_ms_per_job_total \\
        -- benchmarks/pipeline.py --start --jobs 1000 --concurrency 8
    # the same, interleaved with the code of another commit (a worktree): before, after, before, after...
    git worktree add /tmp/before 2cd46d4
    python benchmarks/rounds.py --runs 5 --tree before=/tmp/before --tree after=. --field end_to_end_jobs_per_s \\
        -- benchmarks/pipeline.py --start --jobs 1000

Each run is `python SCRIPT ARGS` in the tree's folder with PYTHONPATH set to it; the benchmark's JSON (the last
thing it prints on stdout) is read, and each `--field` (a dotted path, `cpu_ms_per_job.scheduler`;
a list index too: `2.service.jobs_per_s`) is collected. The load average before each run is
recorded, since what else runs on the machine moves every figure. Prints one JSON object; `--markdown` adds a
table row per version and field.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path


def parse_json_tail(stdout: str):
    """The JSON a benchmark printed last: from the first line that opens it (`{` or `[` at the line's start)."""
    lines = stdout.splitlines()
    for i, line in enumerate(lines):
        if line[:1] in "{[":
            try:
                return json.loads("\n".join(lines[i:]))
            except json.JSONDecodeError:
                continue
    raise ValueError("no JSON in the benchmark's output")


def pick(doc, path: str):
    """`path`'s value in `doc`; keys may contain dots: the longest key that matches
    is taken first."""
    if path == "":
        return doc
    if isinstance(doc, list):
        head, _, rest = path.partition(".")
        return pick(doc[int(head)], rest)
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in doc:
            return pick(doc[key], ".".join(parts[n:]))
    raise KeyError(path)


def summary(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values), "runs": len(values)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="rounds (each version once per round)")
    parser.add_argument(
        "--tree", action="append", default=[], help="NAME=FOLDER of a version of the code (default: this one)"
    )
    parser.add_argument("--field", action="append", required=True, help="a figure of the benchmark's JSON")
    parser.add_argument(
        "--markdown", action="store_true", help="also print a table row per version and field"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- SCRIPT ARGS (run with this Python)")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the benchmark after --")
    trees = [tuple(t.split("=", 1)) for t in args.tree] or [("this", ".")]
    values: dict[str, dict[str, list[float]]] = {name: {f: [] for f in args.field} for name, _ in trees}
    loads: dict[str, list[float]] = {name: [] for name, _ in trees}
    for round_ in range(1, args.runs + 1):
        for name, folder in trees:
            folder = str(Path(folder).resolve())
            loads[name].append(os.getloadavg()[0])
            print(f"round {round_}/{args.runs}: {name} (load {loads[name][-1]:.2f})", file=sys.stderr)
            env = {**os.environ, "PYTHONPATH": folder}
            done = subprocess.run(
                [sys.executable, *command], cwd=folder, env=env, stdout=subprocess.PIPE, text=True
            )
            if done.returncode:
                print(f"{name}: the benchmark failed (status {done.returncode})", file=sys.stderr)
                return 1
            result = parse_json_tail(done.stdout)
            for field in args.field:
                values[name][field].append(float(pick(result, field)))
    report = {
        name: {
            "load_average_before": summary(loads[name]),
            **{field: summary(v) for field, v in fields.items()},
        }
        for name, fields in values.items()
    }
    print(json.dumps(report, indent=2))
    if args.markdown:
        for name, fields in report.items():
            for field, s in fields.items():
                if field != "load_average_before":
                    print(f"| {name} | {field} | {s['min']:g} / {s['median']:g} / {s['max']:g} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
