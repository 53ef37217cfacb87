"""End-to-end pipeline benchmark: submit N no-op jobs to GPUYARD and measure how fast they move.

    # against a platform you started (`gpuyard up --simulate-gpus 8`), with the token it saved:
    python benchmarks/pipeline.py --jobs 1000
    # or let the benchmark start its own platform in a temporary directory:
    python benchmarks/pipeline.py --start --jobs 1000

Reports submit→placed and submit→running latency (p50, p99), taken from the events' own timestamps (all
recorded on this host's clock), and the sustained rate: jobs finished per second from the first submit to
the last job's end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

from rich.progress import Progress

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuyard.client import Client  # noqa: E402

NOOP = {"command": ["true"], "resources": {"gpus": 0.125, "cpus": 0.01, "memory": "1MB"}}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def when(event: dict) -> float:
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def start_platform(gpus: int) -> tuple[subprocess.Popen, Client, Path]:
    tmp = Path(tempfile.mkdtemp(prefix="gpuyard-bench-"))
    env = {**__import__("os").environ, "GPUYARD_CONFIG_DIR": str(tmp / "config")}
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gpuyard"),
            "up",
            "--data-dir",
            str(tmp / "data"),
            "--simulate-gpus",
            str(gpus),
            "--port",
            "18480",
            "--nats-port",
            "14622",
        ],
        env=env,
        stdout=(tmp / "up.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            token = json.loads((tmp / "config" / "config.json").read_text())["token"]
            client = Client("http://127.0.0.1:18480", token)
            if client.healthy() and any(n["gpus"] for n in client.request("GET", "/v1/nodes")):
                return proc, client, tmp
        except (OSError, ValueError, KeyError, Exception):
            pass
        time.sleep(0.2)
    raise SystemExit(f"platform did not start; see {tmp / 'up.log'}")


def run(client: Client, jobs: int, concurrency: int) -> dict:
    ids: list[str] = []
    t0 = time.time()
    with Progress() as progress, ThreadPoolExecutor(concurrency) as pool:
        task = progress.add_task("submitting", total=jobs)
        for accepted in pool.map(lambda _: client.submit(NOOP), range(jobs)):
            ids.append(accepted["job_id"])
            progress.advance(task)
        submitted_s = time.time() - t0
        done = progress.add_task("finishing", total=jobs)
        remaining = set(ids)
        while remaining:
            page = client.jobs(state=["succeeded", "failed", "cancelled"], limit=500)
            finished = {j["job_id"] for j in page["items"]} & remaining
            # the newest 500 may not cover everything: ask for the rest one by one when few remain
            if not finished and len(remaining) < 50:
                finished = {
                    i for i in remaining if client.job(i)["state"] in ("succeeded", "failed", "cancelled")
                }
            remaining -= finished
            progress.update(done, completed=jobs - len(remaining))
            time.sleep(0.2)
    placed, running, ends, failed = [], [], [], 0
    for job_id in ids:
        events = {e["event"]["type"].rsplit(".", 1)[-1]: e["event"] for e in client.events(job_id)}
        t_sub = when(events["submitted"])
        placed.append(when(events["placed"]) - t_sub)
        running.append(when(events["started"]) - t_sub)
        ends.append(when(events.get("succeeded") or events["failed"]))
        failed += "failed" in events
    span = max(ends) - t0
    return {
        "jobs": jobs,
        "concurrency": concurrency,
        "failed": failed,
        "submit_rate_per_s": round(jobs / submitted_s, 1),
        "end_to_end_jobs_per_s": round(jobs / span, 1),
        "submit_to_placed_ms": {
            "p50": round(pct(placed, 50) * 1e3, 1),
            "p99": round(pct(placed, 99) * 1e3, 1),
        },
        "submit_to_running_ms": {
            "p50": round(pct(running, 50) * 1e3, 1),
            "p99": round(pct(running, 99) * 1e3, 1),
        },
        "mean_submit_to_running_ms": round(statistics.mean(running) * 1e3, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8, help="parallel HTTP submitters")
    parser.add_argument("--start", action="store_true", help="start a platform with 8 simulated GPUs")
    parser.add_argument("--server")
    parser.add_argument("--token")
    args = parser.parse_args()
    proc = None
    if args.start:
        proc, client, _ = start_platform(8)
    else:
        client = Client(args.server, args.token)
    try:
        result = run(client, args.jobs, args.concurrency)
    finally:
        if proc:
            proc.send_signal(2)
            proc.wait(60)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
