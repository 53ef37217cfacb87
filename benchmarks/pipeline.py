"""End-to-end pipeline benchmark: submit N no-op jobs to GPUYARD and measure how fast they move.

    # against a platform you started (`gpuyard up --simulate-gpus 8`), with the token it saved:
    python benchmarks/pipeline.py --jobs 1000
    # or let the benchmark start its own platform in a temporary directory:
    python benchmarks/pipeline.py --start --jobs 1000
    # the cost of a replicated bus: one server against a three-server JetStream cluster (R3), in turn:
    python benchmarks/pipeline.py --start --jobs 1000 --nats-cluster 1,3,1,3,1,3

Reports submit→placed, submit→running, placed→running and running→end latency (p50, p99; a no-op job ends at
once, so running→end is how long the platform takes to see and record an end), from the events' own
timestamps (all recorded on this host's clock), and the sustained rate: jobs finished per second from the
first submit to the last job's end. The benchmark follows the jobs on NATS (`--nats`, plain subscriptions to the job
subjects it times), so that watching them costs the platform nothing; it only submits over HTTP, on
`--concurrency` keep-alive connections from one event loop. With `--cpu`, it also reports the
CPU time each of the platform's processes spent per job (Linux /proc), which says how many jobs a second the
machine's cores could carry, whatever else runs on it, and each service's resident memory (VmRSS, the
largest of its processes) before and after the run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from urllib.parse import urlsplit

import nats
from rich.console import Console
from rich.progress import Progress

from gpuyard.client import Client
from gpuyard.shared.bus.credentials import credentials_path, read_credentials
from gpuyard.shared.contracts.events.subjects import Subject, subject_filter
from gpuyard.shared.runtime.service import event_loop_factory
from gpuyard.supervisor.ports import free_ports, port_free

CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")
RETRY_AFTER = re.compile(rb"(?i)\r\nretry-after: *(\d+)")
NOOP = {"command": ["true"], "resources": {"gpus": 0.125, "cpus": 0.01, "memory": "1MB"}}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


def p50_p99(seconds: list[float]) -> dict[str, float]:
    return {"p50": round(pct(seconds, 50) * 1e3, 1), "p99": round(pct(seconds, 99) * 1e3, 1)}


def when(event: dict) -> float:
    return datetime.fromisoformat(event["time"].replace("Z", "+00:00")).timestamp()


def job_root_of(tmp: Path) -> Path:
    """The benchmark's own job root (the working directories of jobs that run as other users, outside the
    private data directory, in a folder every user may pass through), removed with it: the default,
    /var/lib/gpuyard-jobs, is every platform's of the machine, and runs that leave thousands of folders each
    in one directory slow down every later run's mkdir there."""
    return Path(f"{tmp}-jobs")


def stop_platform(proc: subprocess.Popen, tmp: Path, keep: bool = False) -> None:
    """Stop `gpuyard up` (as Ctrl-C does), then remove its folders unless `keep`."""
    proc.send_signal(2)
    proc.wait(120)
    if keep:
        print(f"the platform's data dir: {tmp / 'data'}", file=sys.stderr)
    else:
        shutil.rmtree(tmp, ignore_errors=True)  # (20,000 jobs leave about 0.5 GB)
        shutil.rmtree(job_root_of(tmp), ignore_errors=True)


def nats_base_port(servers: int, avoid: set[int]) -> int:
    """A free first NATS port; for a cluster, one whose neighbours above and route ports are free too (`gpuyard
    up --nats-cluster` gives server k the first port + k and routes it on the first port + 2000 + k)."""
    for _ in range(100):
        base = free_ports("127.0.0.1", 1)[0]
        wanted = [base + k for k in range(servers)] + [
            base + 2000 + k for k in range(servers if servers > 1 else 0)
        ]
        if not avoid.intersection(wanted) and all(port_free("127.0.0.1", port) for port in wanted):
            return base
    raise SystemExit(f"no free ports for {servers} NATS servers")


def start_platform(
    gpus: int, executors: int | None, nats_servers: int = 1
) -> tuple[subprocess.Popen, Client, Path, str]:
    """`gpuyard up` on free ports (API, NATS, serving, monitor): the process, a client, its folder, its NATS
    URLs (comma-separated: `nats_servers` of them, a JetStream cluster with streams of 3 replicas when 3)."""
    tmp = Path(tempfile.mkdtemp(prefix="gpuyard-bench-"))
    jobs = job_root_of(tmp)
    jobs.mkdir(0o711)
    jobs.chmod(0o711)  # (whatever the umask: the jobs' users pass through it)
    env = {**os.environ, "GPUYARD_CONFIG_DIR": str(tmp / "config"), "GPUYARD_JOB_ROOT": str(jobs / "jobs")}
    port, serving_port, monitor_port = free_ports("127.0.0.1", 3)
    nats_port = nats_base_port(nats_servers, {port, serving_port, monitor_port})
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "gpuyard"),
            "up",
            "--data-dir",
            str(tmp / "data"),
            "--simulate-gpus",
            str(gpus),
            "--port",
            str(port),
            "--nats-port",
            str(nats_port),
            "--serving-port",
            str(serving_port),
            "--monitor-port",
            str(monitor_port),
            *(["--executors", str(executors)] if executors else []),
            *(["--nats-cluster", str(nats_servers)] if nats_servers > 1 else []),
        ],
        env=env,
        stdout=(tmp / "up.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            token = json.loads((tmp / "config" / "config.json").read_text())["token"]
            client = Client(f"http://127.0.0.1:{port}", token)
            if client.healthy() and any(n["gpus"] for n in client.request("GET", "/v1/nodes")):
                urls = ",".join(f"nats://127.0.0.1:{nats_port + k}" for k in range(nats_servers))
                return proc, client, tmp, urls
        except (OSError, ValueError, KeyError, Exception):
            pass
        time.sleep(0.2)
    stop_platform(proc, tmp, keep=True)  # (nothing left running; its folder kept for its log)
    raise SystemExit(f"platform did not start; see {tmp / 'up.log'}")


class Submitter:
    """One keep-alive HTTP/1.1 connection to the submit API, written out by hand: the load generator shares
    the machine's two cores with the platform, and a general HTTP client costs a millisecond or more of CPU
    per request, a third of what the whole platform spends on a job."""

    def __init__(self, server: str, token: str):
        url = urlsplit(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.head = (
            f"POST /v1/jobs HTTP/1.1\r\nHost: {url.netloc}\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: "
        ).encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes) -> tuple[int, bytes, int | None]:
        """The answer's status, body and Retry-After (seconds, when it says one)."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        self.writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            self.writer = None  # the server closed the connection: open another and send again
            return await self.post(body)
        length = CONTENT_LENGTH.search(head)
        answer = await self.reader.readexactly(int(length.group(1)) if length else 0)
        retry = RETRY_AFTER.search(head)
        return int(head.split(b" ", 2)[1]), answer, int(retry.group(1)) if retry else None

    async def submit(self, body: bytes) -> dict:
        status, answer, _ = await self.post(body)
        if status != 202:
            raise SystemExit(f"submit answered HTTP {status}: {answer[:300].decode(errors='replace')}")
        return json.loads(answer)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Tap:
    """Each job's event times by type, from a plain NATS subscription (the platform does no work for it)."""

    SUBJECTS = ("submitted", "placed", "started", "succeeded", "failed", "cancelled")
    ENDS = ("succeeded", "failed", "cancelled")

    def __init__(self) -> None:
        self.times: dict[str, dict[str, float]] = {}
        self.ended: set[str] = set()
        self.nc = None

    async def open(self, url: str, credentials: Path | None = None) -> Tap:
        auth = {}
        if credentials is not None:  # a read-only bus user (`gpuyard up` makes `integrator`)
            creds = read_credentials(credentials)
            auth = {"user": creds.user, "password": creds.password}
        try:
            servers = url.split(",")  # (a clustered bus: every server's)
            self.nc = await nats.connect(servers, connect_timeout=5, max_reconnect_attempts=0, **auth)
        except Exception as exc:
            raise SystemExit(f"cannot reach NATS at {url} (pass --nats): {exc}") from None
        for kind in self.SUBJECTS:  # every tenant's (job events end with their tenant: job.placed.vision)
            await self.nc.subscribe(subject_filter(Subject(f"job.{kind}")), cb=self.on_msg)
        await self.nc.flush()
        return self

    async def on_msg(self, msg) -> None:
        event = json.loads(msg.data)
        kind = event["type"].rsplit(".", 1)[-1]
        self.times.setdefault(event["subject"], {})[kind] = when(event)
        if kind in self.ENDS:
            self.ended.add(event["subject"])

    async def close(self) -> None:
        await self.nc.close()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def rss_mib(pid: int) -> float:
    """Resident memory of a process (VmRSS), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def rss_by_service(processes: dict[int, str]) -> dict[str, float]:
    """The largest resident memory among each service's processes (the executors: the largest of them)."""
    out: dict[str, float] = {}
    for pid, name in processes.items():
        try:
            out[name] = max(out.get(name, 0.0), rss_mib(pid))
        except OSError:
            continue
    return out


def platform_processes(up_pid: int) -> dict[int, str]:
    """The platform's processes: `gpuyard up`, its children (services and nats-server) and theirs (each
    executor's reaper), without the jobs' processes under the reapers."""
    parents: dict[int, list[int]] = {}
    names: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError):
            continue
        pid = int(entry.name)
        parents.setdefault(int(stat[1]), []).append(pid)
        module = next((a.decode() for a in argv if a.startswith(b"gpuyard.services.")), None)
        service = module and module.removeprefix("gpuyard.services.")  # (its name: scheduler, executor…)
        reaper = any(a.endswith(b"reaper/__main__.py") for a in argv)
        names[pid] = "reaper" if reaper else service or Path(argv[0].decode(errors="replace")).name
    found = {up_pid: "gpuyard up"}
    todo = [up_pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            if child in names:
                found[child] = names[child]
                if names[child] != "reaper":  # below a reaper: the jobs
                    todo.append(child)
    return found


async def run(
    server: str,
    token: str,
    nats_url: str,
    jobs: int,
    concurrency: int,
    up_pid: int | None,
    rate: float | None,
    credentials: Path | None = None,
) -> dict:
    tap = await Tap().open(nats_url, credentials)
    submitters = [Submitter(server, token) for _ in range(concurrency)]
    body = json.dumps(NOOP).encode()
    ids: list[str] = []
    order = iter(range(jobs))
    sent_at: dict[str, float] = {}  # job id -> when its POST left the client
    processes = platform_processes(up_pid) if up_pid else {}
    cpu_before = {pid: cpu_seconds(pid) for pid in processes}
    rss_before = rss_by_service(processes)
    client_before = time.process_time()
    t0 = time.time()

    async def submit_all(submitter: Submitter) -> None:
        for i in order:  # shared: each job is taken by the first free submitter
            if rate:  # paced: job i leaves at t0 + i/rate, so latency is measured below saturation
                await asyncio.sleep(max(0.0, t0 + i / rate - time.time()))
            sent = time.time()
            job_id = (await submitter.submit(body))["job_id"]
            sent_at[job_id] = sent
            ids.append(job_id)

    with Progress(console=Console(stderr=True)) as progress:  # stdout: the result alone
        task = progress.add_task("submitting", total=jobs)
        senders = asyncio.gather(*(submit_all(s) for s in submitters))
        while not senders.done():
            progress.update(task, completed=len(ids))
            await asyncio.wait([senders], timeout=0.1)
        await senders
        progress.update(task, completed=jobs)
        submitted_s = time.time() - t0
        done = progress.add_task("finishing", total=jobs)
        deadline = time.monotonic() + 60 + jobs
        while (finished := len(tap.ended.intersection(ids))) < jobs and time.monotonic() < deadline:
            progress.update(done, completed=finished)
            await asyncio.sleep(0.1)
    for submitter in submitters:
        submitter.close()
    await tap.close()
    rss_after = rss_by_service(processes)
    cpu_ms: dict[str, float] = {}
    for pid, before in cpu_before.items():  # processes of one service (the executors) together
        spent = (cpu_seconds(pid) - before) * 1e3 / jobs
        cpu_ms[processes[pid]] = round(cpu_ms.get(processes[pid], 0) + spent, 2)
    missing = [i for i in ids if i not in tap.ended]
    if missing:
        raise SystemExit(f"{len(missing)} jobs did not finish, e.g. {missing[0]}")
    placed, running, from_client, launch, ending, ends, failed = [], [], [], [], [], [], 0
    for job_id in ids:
        times = tap.times[job_id]
        placed.append(times["placed"] - times["submitted"])
        running.append(times["started"] - times["submitted"])
        from_client.append(times["started"] - sent_at[job_id])
        launch.append(times["started"] - times["placed"])
        ends.append(max(times.get(k, 0) for k in Tap.ENDS))
        ending.append(ends[-1] - times["started"])
        failed += "failed" in times
    span = max(ends) - t0
    result = {
        "jobs": jobs,
        "concurrency": concurrency,
        "rate": rate,
        "failed": failed,
        "submit_rate_per_s": round(jobs / submitted_s, 1),
        "end_to_end_jobs_per_s": round(jobs / span, 1),
        "submit_to_placed_ms": p50_p99(placed),
        "submit_to_running_ms": p50_p99(running),
        "client_to_running_ms": p50_p99(from_client),  # from before the HTTP request (the same host clock)
        "placed_to_running_ms": p50_p99(launch),  # the executor's part: a queue of launches shows here
        # a no-op job ends at once: this is how long the platform takes to see and record an end
        "running_to_end_ms": p50_p99(ending),
        "mean_submit_to_running_ms": round(statistics.mean(running) * 1e3, 1),
    }
    if cpu_ms:
        result["executor_processes"] = sum(name == "executor" for name in processes.values())
        result["cpu_ms_per_job"] = cpu_ms
        result["cpu_ms_per_job_total"] = round(sum(cpu_ms.values()), 2)
        result["rss_mib_before_after"] = {n: [rss_before.get(n), rss_after[n]] for n in sorted(rss_after)}
    # the benchmark's own share of the same cores (submitting and following), not counted above
    result["client_cpu_ms_per_job"] = round((time.process_time() - client_before) * 1e3 / jobs, 2)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=8, help="parallel HTTP submitters")
    parser.add_argument(
        "--rate", type=float, help="submit at this many jobs/s (default: as fast as the submitters can)"
    )
    parser.add_argument("--start", action="store_true", help="start a platform with 8 simulated GPUs")
    parser.add_argument(
        "--keep",
        action="store_true",
        help="with --start: keep its data dir (its event store, logs) afterwards",
    )
    parser.add_argument(
        "--executors", type=int, metavar="N", help="with --start: executor processes (default: gpuyard up's)"
    )
    parser.add_argument("--server")
    parser.add_argument("--token")
    parser.add_argument("--nats", default="nats://127.0.0.1:4222", help="NATS URL of the platform")
    parser.add_argument(
        "--nats-credentials",
        type=Path,
        help="bus user to follow the jobs as: <data dir>/bus/integrator.json of the platform",
    )
    parser.add_argument(
        "--cpu", type=int, metavar="PID", help="pid of `gpuyard up`: report CPU ms per job per process"
    )
    parser.add_argument(
        "--nats-cluster",
        type=nats_cluster_sizes,
        default=[1],
        metavar="N[,N…]",
        help="with --start: NATS servers of the platform (`gpuyard up --nats-cluster`; 3: a JetStream cluster, "
        "streams of 3 replicas); several, comma-separated: one platform each, in turn, their results together "
        "(1,3,1,3: one server against a cluster, same run)",
    )
    args = parser.parse_args()
    if len(args.nats_cluster) > 1 or args.nats_cluster != [1]:
        if not args.start:
            parser.error("--nats-cluster needs --start")
        runs = [{"nats_servers": n, **measure(args, n)} for n in args.nats_cluster]
        print(json.dumps({"runs": runs, "jobs_per_s_by_servers": rates_by_servers(runs)}, indent=2))
        return 0
    print(json.dumps(measure(args), indent=2))
    return 0


def nats_cluster_sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: numbers of servers, comma-separated (1,3)") from None
    if any(n < 1 or n == 2 for n in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: 1 (one server) or 3 and more")
    return sizes


def rates_by_servers(runs: list[dict]) -> dict[str, dict[str, float]]:
    """The end-to-end rate of the runs of each number of servers: min, median, max."""
    out: dict[str, dict[str, float]] = {}
    for n in sorted({r["nats_servers"] for r in runs}):
        rates = [r["end_to_end_jobs_per_s"] for r in runs if r["nats_servers"] == n]
        out[str(n)] = {"min": min(rates), "median": statistics.median(rates), "max": max(rates)}
    return out


def measure(args: argparse.Namespace, nats_servers: int = 1) -> dict:
    """One run: on a platform of its own (`--start`, with `nats_servers` NATS servers), or on the one given."""
    proc = None
    if args.start:
        proc, client, tmp, args.nats = start_platform(8, args.executors, nats_servers)
        args.cpu = proc.pid
        args.nats_credentials = credentials_path(tmp / "data", "integrator")
    else:
        client = Client(args.server, args.token)
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return runner.run(
                run(
                    client.server,
                    client.token,
                    args.nats,
                    args.jobs,
                    args.concurrency,
                    args.cpu,
                    args.rate,
                    args.nats_credentials,
                )
            )
    finally:
        if proc:
            stop_platform(proc, tmp, args.keep)


if __name__ == "__main__":
    sys.exit(main())
