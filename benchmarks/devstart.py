"""Dev environments: from `gpuyard dev start` to JupyterLab answering through the platform's proxy, and what
the proxy adds to a Jupyter REST call against the same call sent to the notebook server directly.

    python benchmarks/devstart.py                       # 10 starts, 200 calls of each kind
    python benchmarks/devstart.py --starts 3 --calls 20 # a quick look

Starts `gpuyard up --simulate-gpus 2` on free ports (removed afterwards). Each start is the CLI as a user types
it, `gpuyard dev start --gpus 0.5` in a process of its own (the CLI's own start included), which returns once
`GET /dev/{id}/api/status` answers 200 through the platform: the environment queued, placed, started, and its
JupyterLab listening; then `gpuyard dev stop` and its end are waited for (not counted), so that each start
finds the same free GPUs. JupyterLab is the node's own install (no `--env`: nothing to build), run as the
platform's own user (GPUYARD_JOB_USERS=*=platform, unless set) whose install it is. The calls
alternate, `GET /dev/{id}/api/status` through the API (bearer token) and the same to JupyterLab on the node's
loopback (its port and token derived as the submit service derives them), each kind on one keep-alive
connection of its own; `--warmup` are not counted. Prints one JSON object: min / p50 / max of the starts in
seconds, min / p50 / p99 of each kind of call in milliseconds, and the proxy's added latency (difference of the
p50s)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from gpuyard.shared.auth.devtoken import dev_port, dev_token
from gpuyard.shared.auth.jobtokens import read_secret, secret_path

# imported as benchmarks.devstart (python -m, a test), or run as a script: its own folder first on the path
if __package__:
    from benchmarks.exec_latency import alternating, summary
    from benchmarks.pipeline import pct, start_platform, stop_platform
else:
    from exec_latency import alternating, summary
    from pipeline import pct, start_platform, stop_platform

GPUYARD = str(Path(sys.executable).parent / "gpuyard")
STOP_WAIT_S = 60.0


def cli(client, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPUYARD_SERVER": client.server, "GPUYARD_TOKEN": client.token}
    return subprocess.run([GPUYARD, *args], env=env, capture_output=True, text=True, timeout=600)


def one_start(client) -> tuple[float, str]:
    """Seconds from `gpuyard dev start` to its return (JupyterLab answering through the proxy), and its id."""
    began = time.perf_counter()
    done = cli(client, "dev", "start", "--gpus", "0.5", "--json")
    took = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"gpuyard dev start: {done.stderr or done.stdout}")
    return took, json.loads(done.stdout)["job_id"]


def stopped(client, job_id: str) -> None:
    if cli(client, "dev", "stop", job_id).returncode != 0:
        raise SystemExit(f"gpuyard dev stop {job_id} failed")
    deadline = time.monotonic() + STOP_WAIT_S
    while client.job(job_id).state.value != "cancelled":
        if time.monotonic() > deadline:
            raise SystemExit(f"dev environment {job_id} did not end within {STOP_WAIT_S:.0f} s")
        time.sleep(0.05)


def calls(client, data_dir: Path, job_id: str, count: int, warmup: int) -> tuple[list[float], list[float]]:
    """(through the proxy, direct) seconds per `GET /dev/{id}/api/status`, alternating."""
    secret = read_secret(secret_path(data_dir))
    path = f"/dev/{job_id}/api/status"
    with (
        httpx.Client(headers={"Authorization": f"Bearer {client.token}"}, timeout=10) as via,
        httpx.Client(headers={"Authorization": f"token {dev_token(secret, job_id, 1)}"}, timeout=10) as plain,
    ):
        direct_url = f"http://127.0.0.1:{dev_port(secret, job_id, 1)}{path}"
        return alternating(via, client.server + path, plain, direct_url, count, warmup)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the platform's folder (its log)")
    args = parser.parse_args(argv)
    os.environ.setdefault(
        "GPUYARD_JOB_USERS", "*=platform"
    )  # (JupyterLab: the platform's own install, its user's)
    proc, client, tmp, _ = start_platform(2, 1)
    try:
        starts = []
        for _ in range(args.starts):
            took, job_id = one_start(client)
            starts.append(took)
            stopped(client, job_id)
        _, job_id = one_start(client)
        through, direct = calls(client, tmp / "data", job_id, args.calls, args.warmup)
        stopped(client, job_id)
    finally:
        stop_platform(proc, tmp, keep=args.keep)
    proxied, plain = summary(through), summary(direct)
    result = {
        "benchmark": "devstart",
        "dev_start_to_answering_s": {
            "min": round(min(starts), 3),
            "p50": round(pct(starts, 50), 3),
            "max": round(max(starts), 3),
            "n": len(starts),
        },
        "status_through_proxy_ms": proxied,
        "status_direct_ms": plain,
        "proxy_added_p50_ms": round(proxied["p50"] - plain["p50"], 2),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
