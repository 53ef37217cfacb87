"""Run a command several times in a row while every core is kept busy by another process, and report each run's
exit code and wall time, with min / median / max: how the test suite is shown to hold on a loaded machine.

    python benchmarks/under_load.py --runs 3 -- make test          # the suite, three times, both cores busy
    python benchmarks/under_load.py --runs 1 --busy 0 -- make test  # once on a quiet machine, for its time

The load is one busy loop per core (`--busy N` for another count), each a plain Python process at the same
priority as the command: the command gets about half of the CPU it would have alone. Prints one JSON object;
exits 1 when any run failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time

BUSY_LOOP = "while True: pass"


def start_load(processes: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(processes)]


def stop_load(loops: list[subprocess.Popen]) -> None:
    for loop in loops:
        loop.send_signal(signal.SIGKILL)
    for loop in loops:
        loop.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--busy", type=int, default=os.cpu_count() or 1, help="busy loops (default: one a core)"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.runs < 1 or args.busy < 0:
        parser.error("give --runs 1 or more, --busy 0 or more, and a command after --")
    runs = []
    loops = start_load(args.busy)
    try:
        for k in range(args.runs):
            load = os.getloadavg()[0]
            started = time.monotonic()
            code = subprocess.call(command)
            seconds = time.monotonic() - started
            runs.append({"run": k + 1, "exit_code": code, "seconds": round(seconds, 1), "load_before": load})
            print(f"run {k + 1}: exit {code} in {seconds / 60:.1f} min", file=sys.stderr, flush=True)
    finally:
        stop_load(loops)
    times = [r["seconds"] for r in runs]
    result = {
        "command": command,
        "busy_loops": args.busy,
        "runs": runs,
        "seconds": {"min": min(times), "median": statistics.median(times), "max": max(times)},
        "all_passed": all(r["exit_code"] == 0 for r in runs),
    }
    print(json.dumps(result, indent=2))
    return 0 if result["all_passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
