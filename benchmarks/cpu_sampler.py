"""Run a command and sample, every second, the machine's steal time and the CPU use of chosen processes.

    python benchmarks/cpu_sampler.py [--interval 1] [--match services.,nats-server] -- COMMAND [ARGS...]
    python benchmarks/cpu_sampler.py -- python benchmarks/pipeline.py --start --jobs 1000 --concurrency 8

- steal: the share of CPU time the virtual machine's host took (`steal` in /proc/stat), per interval, in % of
  all the machine's CPU time: a run with much of it measured a slower machine;
- per process whose command line contains one of `--match` (default: GPUYard's services, the executors,
  nats-server and the benchmark's own client): utime + stime from /proc/PID/stat per interval, in % of one
  core, grouped by a short name (submit, executor, ...; several processes of a service are
  added up).

The command's own output goes through unchanged; the samples go to stderr as one JSON object at the end
(`--json FILE` writes it there too): per interval the time, steal % and each group's CPU %, then the summary
(steal mean and max, each group's mean and max).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
MATCH = "services.,nats-server,benchmarks/pipeline.py"


def machine_times() -> tuple[int, int]:
    """(steal, total) jiffies over all CPUs."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    steal = fields[7] if len(fields) > 7 else 0
    return steal, sum(fields[:8])


def group_of(cmdline: list[str], patterns: list[str]) -> str | None:
    text = " ".join(cmdline)
    for pattern in patterns:
        if pattern in text:
            if pattern == "services.":  # `-m gpuyard.services.NAME`: the service's name
                module = next((a for a in cmdline if a.startswith("gpuyard.services.")), "gpuyard.services.?")
                return module.removeprefix("gpuyard.services.")
            return pattern
    return None


def process_times(patterns: list[str], skip: int) -> dict[int, tuple[str, float]]:
    """pid -> (group, CPU seconds so far) for the matching processes."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == skip:
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        group = group_of([a.decode(errors="replace") for a in cmdline if a], patterns)
        if group is None:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(entry)] = (group, (int(fields[11]) + int(fields[12])) / TICKS)  # utime, stime
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--match", default=MATCH, help="comma-separated substrings of command lines")
    parser.add_argument("--json", type=Path)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    patterns = [p for p in args.match.split(",") if p]
    child = subprocess.Popen(command)
    samples = []
    steal0, total0 = machine_times()
    before = process_times(patterns, os.getpid())
    started = last = time.monotonic()
    while child.poll() is None:
        time.sleep(args.interval)
        now = time.monotonic()
        steal1, total1 = machine_times()
        after = process_times(patterns, os.getpid())
        cpu: dict[str, float] = defaultdict(float)
        for pid, (group, seconds) in after.items():
            cpu[group] += seconds - before.get(pid, (group, 0.0))[1]
        span = now - last
        samples.append(
            {
                "t": round(now - started, 1),
                "steal_pct": round(100 * (steal1 - steal0) / max(1, total1 - total0), 1),
                "cpu_pct": {g: round(100 * s / span, 1) for g, s in sorted(cpu.items())},
            }
        )
        steal0, total0, before, last = steal1, total1, after, now
    groups = sorted({g for s in samples for g in s["cpu_pct"]})
    summary = {
        "steal_pct_mean": round(sum(s["steal_pct"] for s in samples) / max(1, len(samples)), 1),
        "steal_pct_max": max((s["steal_pct"] for s in samples), default=0.0),
        "cpu_pct": {
            g: {
                "mean": round(sum(s["cpu_pct"].get(g, 0.0) for s in samples) / max(1, len(samples)), 1),
                "max": max(s["cpu_pct"].get(g, 0.0) for s in samples),
            }
            for g in groups
        },
    }
    result = {"command": command, "interval": args.interval, "samples": samples, "summary": summary}
    text = json.dumps(result)
    print(text, file=sys.stderr)
    if args.json:
        args.json.write_text(text)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
