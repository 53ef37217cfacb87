"""Flood benchmark: many submissions at once, several tenants, one of them beyond its queue limit.

    python benchmarks/flood.py                       # 50,000 submissions to a platform it starts
    python benchmarks/flood.py --jobs 5000 --clients 8

Starts `gpuyard up --simulate-gpus 8` in a temporary directory with a queue limit per tenant
(`GPUYARD_MAX_QUEUED_PER_TENANT`, and a lower one for the greedy tenant through `GPUYARD_QUEUE_LIMITS`), makes
one token per tenant, and submits no-op jobs (`true`, 0.125 GPU) from `--clients` keep-alive connections as
fast as they go: the greedy tenant sends `--greedy-share` of them, the others the rest in equal parts. Every 429
is counted (with its Retry-After); the other tenants wait what Retry-After says and send the job again, the
greedy one goes on with its next job (it floods beyond its limit). Then it waits for every accepted job to end.

Reports: the accepted rate, p50/p99 latency of the accepted and the refused submits (as the client sees them),
429s per tenant, the drain rate (jobs ended a second) while the queue is at least `--deep` jobs deep, the peak
resident memory of each process of the platform (VmHWM from /proc, sampled VmRSS too), and checks that
nothing accepted is lost: every accepted job is read back from the API and must have succeeded. Progress goes
to stderr, the result (JSON) to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from gpuyard.client import Client
from gpuyard.shared.bus.credentials import credentials_path
from gpuyard.shared.runtime.service import event_loop_factory

# imported as benchmarks.flood (python -m, a test), or run as a script: its own folder first on the path
if __package__:
    from benchmarks.pipeline import Submitter, Tap, pct, platform_processes, start_platform, stop_platform
else:
    from pipeline import Submitter, Tap, pct, platform_processes, start_platform, stop_platform

NOOP = {"command": ["true"], "resources": {"gpus": 0.125, "cpus": 0.01, "memory": "1MB"}}
GREEDY = "greedy"


def status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Memory:
    """Peak resident memory of each platform process: VmHWM (the kernel's high-water mark) and the largest
    VmRSS sampled."""

    def __init__(self, up_pid: int):
        self.up_pid = up_pid
        self.names: dict[int, str] = {}
        self.sampled: dict[int, int] = {}
        self.hwm: dict[int, int] = {}

    def sample(self) -> None:
        for pid, name in platform_processes(self.up_pid).items():
            self.names.setdefault(pid, name)
            rss, hwm = status_kib(pid, "VmRSS"), status_kib(pid, "VmHWM")
            if rss:
                self.sampled[pid] = max(self.sampled.get(pid, 0), rss)
                self.hwm[pid] = max(self.hwm.get(pid, 0), hwm)

    def report(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        seen: dict[str, int] = {}
        for pid in sorted(self.names):
            name = self.names[pid]
            n = seen[name] = seen.get(name, -1) + 1
            label = name if n == 0 else f"{name}-{n}"
            out[label] = {
                "peak_rss_mib": round(self.hwm.get(pid, 0) / 1024, 1),
                "largest_sampled_rss_mib": round(self.sampled.get(pid, 0) / 1024, 1),
            }
        return out


async def flood(
    server: str,
    tokens: dict[str, str],
    plan: dict[str, int],
    clients: int,
    nats_url: str,
    credentials: Path,
    memory: Memory,
    deep: int,
) -> dict:
    tap = await Tap().open(nats_url, credentials)
    body = json.dumps(NOOP).encode()
    accepted: dict[str, list[str]] = {t: [] for t in plan}
    refused: dict[str, int] = dict.fromkeys(plan, 0)
    other: dict[int, int] = {}
    retry_after: list[int] = []
    ok_latency: list[float] = []
    refused_latency: list[float] = []
    left = dict(plan)
    tenants = list(plan)
    total = sum(plan.values())

    async def client(tenant: str) -> None:
        """Submits the tenant's jobs; a 429 is waited out (Retry-After) and sent again, except by the greedy
        tenant, which counts it and goes on with its next job."""
        submitter = Submitter(server, tokens[tenant])
        try:
            while left[tenant] > 0:
                left[tenant] -= 1
                while True:
                    t = time.perf_counter()
                    status, answer, retry = await submitter.post(body)
                    took = time.perf_counter() - t
                    if status == 202:
                        ok_latency.append(took)
                        accepted[tenant].append(json.loads(answer)["job_id"])
                    elif status == 429:
                        refused_latency.append(took)
                        refused[tenant] += 1
                        if retry is not None:
                            retry_after.append(retry)
                        if tenant != GREEDY:
                            await asyncio.sleep(retry or 1)
                            continue
                    else:
                        other[status] = other.get(status, 0) + 1
                    break
        finally:
            submitter.close()

    depth_samples: list[tuple[float, int, int]] = []  # (time, queued: accepted - placed, ended)

    def accepted_ids() -> list[str]:
        return [j for ids in accepted.values() for j in ids]

    def placed_and_ended() -> tuple[int, int]:
        placed = sum(1 for t in tap.times.values() if "placed" in t)
        return placed, len(tap.ended)

    t0 = time.time()
    with Progress(console=Console(stderr=True)) as progress:
        sending = progress.add_task("submitting", total=total)
        draining = progress.add_task("ended", total=total)
        workers = asyncio.gather(*(client(tenants[i % len(tenants)]) for i in range(clients)))
        last_sample = last_line = 0.0
        submitted_s = None
        deadline = None
        placed = ended = 0
        while True:
            n_accepted = sum(len(v) for v in accepted.values())
            sent = n_accepted + sum(refused.values()) + sum(other.values())
            now = time.time()
            if now - last_sample >= 0.5:
                placed, ended = placed_and_ended()
                memory.sample()
                depth_samples.append((now, n_accepted - placed, ended))
                last_sample = now
            progress.update(sending, completed=sent)
            if not sys.stderr.isatty() and now - last_line >= 5:  # a log file: one line every 5 s
                print(
                    f"{now - t0:6.0f} s  answered {sent:,}/{total:,}  accepted {n_accepted:,}  429s "
                    f"{sum(refused.values()):,}  queued {n_accepted - placed:,}  ended {ended:,}",
                    file=sys.stderr,
                    flush=True,
                )
                last_line = now
            progress.update(
                draining,
                total=n_accepted,
                completed=ended,
                description=f"ended (queue {n_accepted - placed:,}, 429s {sum(refused.values()):,})",
            )
            if workers.done() and submitted_s is None:
                await workers
                submitted_s = time.time() - t0
                deadline = time.monotonic() + 120 + n_accepted / 50
            if submitted_s is not None and (ended >= n_accepted or time.monotonic() > deadline):
                break
            await asyncio.sleep(0.1)
    drained_s = time.time() - t0
    memory.sample()
    await tap.close()

    ids = accepted_ids()
    deep_rates = [
        (e1 - e0) / (t1 - t0_)
        for (t0_, q0, e0), (t1, q1, e1) in zip(depth_samples, depth_samples[1:], strict=False)
        if min(q0, q1) >= deep and t1 > t0_
    ]
    deep_span = [(t, e) for t, q, e in depth_samples if q >= deep]
    return {
        "ids": ids,
        "result": {
            "submissions": total,
            "clients": clients,
            "plan": plan,
            "accepted": len(ids),
            "accepted_per_tenant": {t: len(v) for t, v in accepted.items()},
            "refused_429_per_tenant": refused,
            "other_statuses": other,
            "retry_after_s": {"min": min(retry_after), "max": max(retry_after)} if retry_after else None,
            "submit_seconds": round(submitted_s, 1),
            "accepted_per_s": round(len(ids) / submitted_s, 1),
            "answers_per_s": round(total / submitted_s, 1),
            "accepted_latency_ms": {
                "p50": round(pct(ok_latency, 50) * 1e3, 1),
                "p99": round(pct(ok_latency, 99) * 1e3, 1),
            },
            "refused_latency_ms": {
                "p50": round(pct(refused_latency, 50) * 1e3, 1),
                "p99": round(pct(refused_latency, 99) * 1e3, 1),
            }
            if refused_latency
            else None,
            "deepest_queue": max(q for _, q, _ in depth_samples),
            f"drain_per_s_while_queue_at_least_{deep}": round(
                (deep_span[-1][1] - deep_span[0][1]) / (deep_span[-1][0] - deep_span[0][0]), 1
            )
            if len(deep_span) > 1
            else None,
            "drain_per_s_while_deep_min_max_of_0.5s_samples": [
                round(min(deep_rates), 1),
                round(max(deep_rates), 1),
            ]
            if deep_rates
            else None,
            "seconds_to_last_end": round(drained_s, 1),
            "end_to_end_jobs_per_s": round(len(tap.ended) / drained_s, 1),
        },
    }


def read_back(client: Client, ids: list[str]) -> dict[str, int]:
    """Every job's state as the API has it (admin: all tenants); counts the accepted ones by state."""
    states: dict[str, str] = {}
    cursor = None
    while True:
        page = client.jobs(limit=500, cursor=cursor)
        states.update((j.job_id, j.state.value) for j in page.items)
        if not page.next_cursor:
            break
        cursor = page.next_cursor
    counts: dict[str, int] = {}
    for job_id in ids:
        state = states.get(job_id, "missing")
        counts[state] = counts.get(state, 0) + 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=50_000, help="submissions in all")
    parser.add_argument("--clients", type=int, default=16, help="concurrent HTTP connections")
    parser.add_argument(
        "--tenants", type=int, default=4, help="tenants within their limit (plus the greedy one)"
    )
    parser.add_argument("--limit", type=int, default=2_500, help="GPUYARD_MAX_QUEUED_PER_TENANT")
    parser.add_argument("--greedy-limit", type=int, default=500, help="the greedy tenant's own limit")
    parser.add_argument("--greedy-share", type=float, default=0.2, help="share of the submissions it sends")
    parser.add_argument("--deep", type=int, default=5_000, help="queue depth the drain rate is measured at")
    parser.add_argument("--executors", type=int, help="executor processes (default: gpuyard up's)")
    args = parser.parse_args()

    greedy = int(args.jobs * args.greedy_share)
    plan = {f"team{i}": (args.jobs - greedy) // args.tenants for i in range(args.tenants)}
    plan[f"team{args.tenants - 1}"] += args.jobs - greedy - sum(plan.values())
    plan[GREEDY] = greedy
    os.environ["GPUYARD_MAX_QUEUED_PER_TENANT"] = str(args.limit)
    os.environ["GPUYARD_QUEUE_LIMITS"] = f"{GREEDY}={args.greedy_limit}"
    proc, admin, tmp, nats_url = start_platform(8, args.executors)  # on free ports
    print(f"platform in {tmp} (gpuyard up pid {proc.pid})", file=sys.stderr)
    try:
        tokens = {t: admin.create_token(tenant=t, user="bench").token for t in plan}
        memory = Memory(proc.pid)
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            out = runner.run(
                flood(
                    admin.server,
                    tokens,
                    plan,
                    args.clients,
                    nats_url,
                    credentials_path(tmp / "data", "integrator"),
                    memory,
                    args.deep,
                )
            )
        result = out["result"]
        states = read_back(Client(admin.server, admin.token, timeout=60), out["ids"])
        result["accepted_by_state"] = states
        result["nothing_accepted_lost"] = states == {"succeeded": len(out["ids"])}
        result["memory"] = memory.report()
        result["limits"] = {"per_tenant": args.limit, GREEDY: args.greedy_limit}
    finally:
        stop_platform(proc, tmp)
    print(json.dumps(result, indent=2))
    return 0 if result["nothing_accepted_lost"] else 1


if __name__ == "__main__":
    sys.exit(main())
