"""Monitor ingest benchmark: 1,000 simulated GPUs (125 nodes × 8 by default) publishing `gpu.sample` at 1 Hz to a
real NATS server (JetStream, as the monitors publish them), taken in by the monitor's real ingest path
(`gpuyard.services.monitor.ingest.SampleIngest` behind a core subscription to `gpu.sample`, as `Monitor.listen` makes
it) in a process of its own, with the real `/metrics` (`gpuyard.services.monitor.metrics`, cluster scope).

    python benchmarks/monitor.py                       # 125 nodes × 8 GPUs, 10 s warm-up, 60 s measured
    python benchmarks/monitor.py --nodes 250 --seconds 120

Reports, as one JSON object at the end (benchmarks/rounds.py reads it):
- ingest lag (a sample's arrival in the ingest process minus its `time`, both on this host's clock): p50, p99
  and max over the measured window, and the mean of its first and last tenth: a lag that grows means the
  ingest does not keep up;
- the ingest process's CPU over the measured window: % of one core, µs per node sample and per GPU reading;
- `/metrics` with every GPU: scrape time (p50, max of `--scrapes` GETs, taken after the window while the
  samples keep coming), the CPU one scrape costs the monitor, and its size in bytes and series.
The target: 1 Hz for 1,000 GPUs under 10 % of one core.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuProcessUse, GpuReading, GpuSample
from gpuyard.shared.contracts.events.subjects import STREAMS, Subject
from gpuyard.shared.runtime.service import event_loop_factory
from gpuyard.supervisor.ports import free_ports

GIB = 1 << 30


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))] if values else 0.0


# ---------------------------------------------------------------------- the ingest process


async def ingest_main(nats_url: str, metrics_port: int) -> None:
    """The monitor's ingest and /metrics, alone in this process: prints `ready`, then on SIGTERM the lags and
    CPU times it recorded, as JSON."""
    from gpuyard.services.monitor.ingest import SampleIngest
    from gpuyard.services.monitor.metrics import MetricsServer, make_registry

    bus = await Bus.connect([nats_url], name="bench-monitor", source="/bench/monitor")
    ingest = SampleIngest()
    arrivals: list[tuple[float, float]] = []  # (arrival, lag)
    ingest.subscribe(lambda s: arrivals.append((s.received_at, s.lag)))
    server = MetricsServer(make_registry(ingest, None), "127.0.0.1", metrics_port).start()
    await bus.subscribe(Subject.GPU_SAMPLE.value, ingest.on_message)
    marks: dict[str, tuple[float, float]] = {}
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(
        signal.SIGUSR1, lambda: marks.setdefault("start", (time.time(), time.process_time()))
    )
    loop.add_signal_handler(
        signal.SIGUSR2, lambda: marks.setdefault("end", (time.time(), time.process_time()))
    )
    print("ready", flush=True)
    await stop.wait()
    marks["stop"] = (time.time(), time.process_time())
    server.stop()
    await bus.close()
    print(
        json.dumps(
            {
                "arrivals": arrivals,
                "marks": marks,
                "ingested": ingest.ingested,
                "ignored": ingest.ignored,
            }
        ),
        flush=True,
    )


# ---------------------------------------------------------------------- the fake nodes


def node_sample(node: int, gpus: int) -> GpuSample:
    readings = [
        GpuReading(
            index=i,
            uuid=f"GPU-bench-{node:04d}-{i}",
            model="H100",
            pci_bus_id=f"00000000:{i:02X}:00.0",
            utilization_pct=float((node * 7 + i * 13) % 101),
            memory_util_pct=20.0,
            memory_used_bytes=(i + 1) * GIB,
            memory_total_bytes=80 * GIB,
            temperature_c=55.0 + i,
            power_w=300.0 + i,
            power_limit_w=700.0,
            sm_clock_mhz=1980,
            memory_clock_mhz=2619,
            ecc_corrected=0,
            ecc_uncorrected=0,
            processes=[GpuProcessUse(pid=10_000 + i, used_bytes=(i + 1) * GIB)],
            holders=[GpuHolder(job_id=f"job-{node:04d}-{i}", tenant=f"tenant-{node % 5}", user="bench")],
        )
        for i in range(gpus)
    ]
    return GpuSample(node=f"bench-node-{node:04d}", gpus=readings, interval_seconds=1.0)


async def publish_nodes(bus: Bus, nodes: int, gpus: int, until: float) -> int:
    """Every node one sample a second, the nodes spread over the second (as independent monitors are)."""
    samples = [node_sample(n, gpus) for n in range(nodes)]
    sent = 0
    start = time.monotonic()
    tick = 0
    while time.monotonic() < until:
        for n, sample in enumerate(samples):
            due = start + tick + n / nodes
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await bus.send(make_event(sample, source=f"/bench/{sample.node}"))
            sent += 1
        tick += 1
    return sent


# ---------------------------------------------------------------------- the run


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def start_nats(folder: Path) -> tuple[subprocess.Popen, str]:
    binary = Path(sys.executable).parent / "nats-server"
    binary = str(binary) if binary.exists() else shutil.which("nats-server")
    [port] = free_ports("127.0.0.1", 1)
    proc = subprocess.Popen(
        [binary, "-js", "-sd", str(folder / "nats"), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 10
    while not listening(port):
        if time.monotonic() > deadline:
            raise RuntimeError("nats-server did not start")
        time.sleep(0.05)
    return proc, f"nats://127.0.0.1:{port}"


async def run(args: argparse.Namespace) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="gpuyard-monitor-bench-"))
    nats_proc, nats_url = start_nats(folder)
    ingester = None
    try:
        for _ in range(100):
            try:
                bus = await Bus.connect(
                    [nats_url], name="bench-nodes", source="/bench/nodes", connect_timeout=1
                )
                break
            except Exception:
                await asyncio.sleep(0.1)
        else:
            raise RuntimeError("nats-server did not start")
        await bus.ensure_streams(STREAMS)
        [metrics_port] = free_ports("127.0.0.1", 1)
        ingester = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--ingest",
            nats_url,
            "--metrics-port",
            str(metrics_port),
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        )
        assert (await ingester.stdout.readline()).strip() == b"ready"
        total = args.warmup + args.seconds + args.scrape_seconds
        publishing = asyncio.create_task(publish_nodes(bus, args.nodes, args.gpus, time.monotonic() + total))
        await asyncio.sleep(args.warmup)
        ingester.send_signal(signal.SIGUSR1)
        await asyncio.sleep(args.seconds)
        ingester.send_signal(signal.SIGUSR2)
        scrapes, body = [], b""
        url = f"http://127.0.0.1:{metrics_port}/metrics"
        async with httpx.AsyncClient(timeout=30) as http:
            for _ in range(args.scrapes):
                began = time.perf_counter()
                answer = await http.get(url)
                scrapes.append(time.perf_counter() - began)
                body = answer.content
                await asyncio.sleep(args.scrape_seconds / max(1, args.scrapes))
        sent = await publishing
        ingester.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(ingester.communicate(), 30)
        await bus.close()
    finally:
        if ingester is not None and ingester.returncode is None:
            ingester.kill()
        nats_proc.terminate()
        nats_proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)

    report = json.loads(out.decode().strip().splitlines()[-1])
    (t0, cpu0), (t1, cpu1) = report["marks"]["start"], report["marks"]["end"]
    t2, cpu2 = report["marks"]["stop"]
    window = [(at, lag) for at, lag in report["arrivals"] if t0 <= at <= t1]
    lags = [lag for _, lag in window]
    tenth = max(1, len(lags) // 10)
    cpu = cpu1 - cpu0
    gpus = args.nodes * args.gpus
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {
        "nodes": args.nodes,
        "gpus": gpus,
        "rate_hz": 1.0,
        "measured_seconds": round(t1 - t0, 2),
        "samples_published": sent,
        "samples_ingested": report["ingested"],
        "samples_in_window": len(window),
        "ingest_lag_ms": {
            "p50": round(pct(lags, 50) * 1e3, 2),
            "p99": round(pct(lags, 99) * 1e3, 2),
            "max": round(max(lags, default=0) * 1e3, 2),
            "first_tenth_mean": round(statistics.fmean(lags[:tenth]) * 1e3, 2) if lags else None,
            "last_tenth_mean": round(statistics.fmean(lags[-tenth:]) * 1e3, 2) if lags else None,
        },
        "ingest_cpu": {
            "pct_of_one_core": round(cpu / (t1 - t0) * 100, 2),
            "us_per_node_sample": round(cpu / max(1, len(window)) * 1e6, 1),
            "us_per_gpu_reading": round(cpu / max(1, len(window) * args.gpus) * 1e6, 2),
        },
        "metrics_scrape": {
            # the ingest process's CPU while it served the scrapes, less what the ingest took meanwhile
            "cpu_ms_each": round(
                max(0.0, (cpu2 - cpu1) - cpu / (t1 - t0) * (t2 - t1)) / max(1, len(scrapes)) * 1e3, 1
            ),
            "ms_p50": round(pct(scrapes, 50) * 1e3, 1),
            "ms_max": round(max(scrapes, default=0) * 1e3, 1),
            "bytes": len(body),
            "series": series,
        },
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average_1m": os.getloadavg()[0],
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=125)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds before the measured window")
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--scrapes", type=int, default=10, help="GETs of /metrics after the window")
    parser.add_argument("--scrape-seconds", type=float, default=10.0, help="spread the scrapes over this")
    parser.add_argument("--ingest", metavar="NATS_URL", help=argparse.SUPPRESS)  # (the ingest process)
    parser.add_argument("--metrics-port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    factory = event_loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        if args.ingest:
            runner.run(ingest_main(args.ingest, args.metrics_port))
            return 0
        result = runner.run(run(args))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
