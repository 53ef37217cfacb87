"""Draining a deep queue: the scheduler's CPU time per placed job as the queue grows.

    python benchmarks/drain.py                      # 1,000 / 5,000 / 20,000 queued, both parts
    python benchmarks/drain.py --queued 20000 --profile   # where a cycle's time goes (cProfile, service part)

The live situation of the operator's probe: one node of 8 simulated GPUs, jobs of 0.125 GPU each (64 fit at
once), every one of them queued long ago (their reasons are due). Each drain cycle, `--ends` of the running jobs
end (an executor's JobStarted + JobSucceeded, written through the same ledger, not timed) and the scheduler runs
one cycle as the live service does (`SchedulerService.decide_and_record` on a real SQLite event store, no
NATS): the queue handed to the core, `decide`, the placements and the due reasons written. Timed: the
scheduler's process CPU time for the events of the ended jobs and the cycle; reported per placed job, and as
jobs/s of scheduler CPU (1000 / ms per job). `core` is `decide` alone on a `HeldCluster` and `HeldQueue` (the
pure part), `service` the whole cycle.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobStarted, JobSubmitted, JobSucceeded
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import Decision, JobLedger

GIB = 1 << 30
TENANTS = 4


def heartbeat(gpus: int = 8) -> NodeHeartbeat:
    return NodeHeartbeat(
        node="node-a",
        gpus=[GpuInfo(index=k, uuid=f"GPU-{k}", model="SIM", memory_bytes=80 * GIB) for k in range(gpus)],
        cpus=256,
        memory_bytes=1024 * GIB,
        simulated=True,
    )


async def submit(ledger: JobLedger, n: int, queued_at: float) -> None:
    spec = JobSpec(command="true", resources={"gpus": 0.125, "cpus": 1, "memory": "1GiB"})
    at = datetime.fromtimestamp(queued_at, UTC)
    for start in range(0, n, 1000):
        decisions = []
        for k in range(start, min(n, start + 1000)):
            data = JobSubmitted(
                job_id=f"job-{k:06d}", name=f"job-{k}", tenant=f"t{k % TENANTS}", user="u", spec=spec
            )
            event = make_event(data, source="/bench", time=at)
            decisions.append(Decision(data.job_id, lambda _v, e=event: e.data))
        await ledger.record_many(decisions, new=True)
    # (the events' time is the submission's: make_event stamps `now`; the queue order is by job id then)


class Service(SimpleNamespace):
    pass


async def drain(queued: int, cycles: int, ends: int, profile: cProfile.Profile | None = None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        store = await open_store(f"sqlite:///{tmp}/events.db")
        ledger = JobLedger(store, None, "/bench")
        service = Service(
            store=store,
            ledger=ledger,
            bus=SimpleNamespace(js=None, replicas=1),
            source="/bench/scheduler",
            stopping=asyncio.Event(),
        )
        await submit(ledger, queued, time.time() - 600)
        scheduler = SchedulerService(service, SchedulerSettings())
        c = time.process_time()
        await scheduler.load()
        load_cpu = time.process_time() - c
        scheduler.view.observe_node(heartbeat())
        await scheduler.decide_and_record()  # fills the node (not timed)
        cpu = 0.0
        placed = 0
        for _ in range(cycles):
            running = [v for v in scheduler.view.jobs.values() if v.state != JobState.QUEUED]
            running.sort(key=lambda v: v.updated_at)
            done = []
            for view in running[:ends]:  # the executor's side: not the scheduler's time
                attempt = view.attempt
                done.append(
                    Decision(
                        view.job_id,
                        lambda v, a=attempt: JobStarted(
                            job_id=v.job_id, attempt=a, node="node-a", replicas=[0]
                        ),
                        then=lambda v, a=attempt: JobSucceeded(job_id=v.job_id, attempt=a),
                    )
                )
            outcomes = await ledger.record_many(done, cached=True)
            before = sum(1 for v in scheduler.view.jobs.values() if v.state == JobState.QUEUED)
            if profile:
                profile.enable()
            c = time.process_time()
            for outcome in outcomes:  # the scheduler sees the ended jobs' events
                scheduler.view.put_job(outcome.view)
            await scheduler.decide_and_record()
            cpu += time.process_time() - c
            if profile:
                profile.disable()
            after = sum(1 for v in scheduler.view.jobs.values() if v.state == JobState.QUEUED)
            placed += before - after
        await store.close()
    ms = 1000 * cpu / max(placed, 1)
    return {
        "queued": queued,
        "cycles": cycles,
        "placed": placed,
        "cpu_ms_per_cycle": round(1000 * cpu / cycles, 3),
        "cpu_ms_per_placed_job": round(ms, 3),
        "jobs_per_cpu_s": round(1000 / ms, 1),
        "load_cpu_s": round(load_cpu, 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queued", default="1000,5000,20000")
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--ends", type=int, default=8, help="jobs that end before each cycle")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for n in map(int, args.queued.split(",")):
        profile = cProfile.Profile() if args.profile else None
        row = asyncio.run(drain(n, args.cycles, args.ends, profile))
        print(json.dumps(row), file=sys.stderr)
        rows.append(row)
        if profile:
            pstats.Stats(profile).sort_stats("cumulative").print_stats(35)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    print(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
