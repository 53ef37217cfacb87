"""Into a running job: the round trip of `gpuyard exec JOB -- true`, and what the platform's proxy adds to an
HTTP GET of a job's port against the same GET sent to the job's server directly.

    python benchmarks/exec_latency.py                        # 50 execs, 200 GETs of each kind
    python benchmarks/exec_latency.py --execs 10 --gets 20   # a quick look

Starts `gpuyard up --simulate-gpus 1` on free ports (removed afterwards) and one job that serves HTTP/1.1 on a
port its spec lists (a page of Python's `http.server`, each answer written whole: `SERVER`). Each exec is one call of the client
library (`gpuyard.access.exec_command`: a WebSocket to the API, the caller checked, the job's node's gateway,
`true` started in the replica's directory, environment and user, its exit code back), not the start of the CLI's
process; `--warmup` are not counted. The GETs alternate, one through `/jobs/{id}/ports/{port}/` on the API and
one to the server directly, each kind on one keep-alive connection of its own. Prints one JSON object: per
measure min / p50 / p99 in milliseconds, and the proxy's added latency as the difference of the p50s."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import httpx

from gpuyard.access import exec_command
from gpuyard.supervisor.ports import free_ports

# imported as benchmarks.exec_latency (python -m, a test), or run as a script: its own folder first on the path
if __package__:
    from benchmarks.pipeline import pct, start_platform, stop_platform
else:
    from pipeline import pct, start_platform, stop_platform

PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
SERVER = """
import http.server, sys

class Page(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16  # (the head and the body in one write: no wait on the client's delayed ACK)

    def do_GET(self):
        body = b"hello\\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Page).serve_forever()
"""
"""The job's server: a small page over HTTP/1.1 keep-alive, each answer written whole at once (Python's own
`http.server` writes a head and a body apart, which a keep-alive client's delayed ACK holds 40 ms)."""
PAGE = "page.txt"
WAIT_S = 60.0


def summary(seconds: list[float]) -> dict[str, float]:
    return {
        "min": round(min(seconds) * 1e3, 2),
        "p50": round(pct(seconds, 50) * 1e3, 2),
        "p99": round(pct(seconds, 99) * 1e3, 2),
        "n": len(seconds),
    }


def serving_job(client, port: int) -> str:
    spec = {
        "name": "exec-bench",
        "command": [PYTHON, "-c", SERVER, str(port)],
        "resources": {"gpus": 0, "cpus": 0.1, "memory": "64MB"},
        "ports": [port],
    }
    job_id = client.submit(spec).job_id
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        if client.job(job_id).state.value == "running":
            try:
                if httpx.get(f"http://127.0.0.1:{port}/{PAGE}", timeout=2).status_code == 200:
                    return job_id
            except httpx.HTTPError:
                pass
        time.sleep(0.1)
    raise SystemExit(f"job {job_id} did not serve its port within {WAIT_S:.0f}s")


async def exec_round_trips(server: str, token: str, job_id: str, count: int, warmup: int) -> list[float]:
    took = []
    for i in range(warmup + count):
        start = time.perf_counter()
        code = await exec_command(server, token, job_id, ["true"])
        if code != 0:
            raise SystemExit(f"exec of true ended with {code}")
        if i >= warmup:
            took.append(time.perf_counter() - start)
    return took


def alternating(
    via: httpx.Client,
    proxied_url: str,
    plain: httpx.Client,
    direct_url: str,
    count: int,
    warmup: int,
    expected: str | None = None,
) -> tuple[list[float], list[float]]:
    """(through the proxy, direct) seconds per GET, alternating, each kind on its own keep-alive client; every
    answer must be 200 (with the text `expected`, where given). The first `warmup` of each are not counted."""
    through: list[float] = []
    direct: list[float] = []
    for i in range(warmup + count):
        for client, url, into in ((via, proxied_url, through), (plain, direct_url, direct)):
            start = time.perf_counter()
            answer = client.get(url)
            took = time.perf_counter() - start
            if answer.status_code != 200 or (expected is not None and answer.text != expected):
                raise SystemExit(f"GET {url}: {answer.status_code} {answer.text[:200]}")
            if i >= warmup:
                into.append(took)
    return through, direct


def gets(
    server: str, token: str, job_id: str, port: int, count: int, warmup: int
) -> tuple[list[float], list[float]]:
    """(through the proxy, direct) seconds per GET of the job's page, alternating."""
    with (
        httpx.Client(headers={"Authorization": f"Bearer {token}"}, timeout=10) as via,
        httpx.Client(timeout=10) as plain,
    ):
        proxied_url = f"{server}/jobs/{job_id}/ports/{port}/{PAGE}"
        return alternating(
            via, proxied_url, plain, f"http://127.0.0.1:{port}/{PAGE}", count, warmup, "hello\n"
        )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execs", type=int, default=50)
    parser.add_argument("--gets", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the platform's folder (its log)")
    args = parser.parse_args(argv)
    proc, client, tmp, _ = start_platform(1, 1)
    try:
        port = free_ports("127.0.0.1", 1)[0]
        job_id = serving_job(client, port)
        execs = asyncio.run(exec_round_trips(client.server, client.token, job_id, args.execs, args.warmup))
        through, direct = gets(client.server, client.token, job_id, port, args.gets, args.warmup)
        client.cancel(job_id)
    finally:
        stop_platform(proc, tmp, keep=args.keep)
    proxied, plain = summary(through), summary(direct)
    result = {
        "benchmark": "exec_latency",
        "exec_true_round_trip_ms": summary(execs),
        "get_through_proxy_ms": proxied,
        "get_direct_ms": plain,
        "proxy_added_p50_ms": round(proxied["p50"] - plain["p50"], 2),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
