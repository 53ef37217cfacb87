"""What taking a job's turn costs a write through the job ledger (`JobLedger.record`), in CPU microseconds (the services' event loop).

    python benchmarks/ledger_turns.py            # this checkout
    PYTHONPATH=/path/to/other/checkout python benchmarks/ledger_turns.py   # another one, to compare

The store is an in-memory stand-in that answers at once (no I/O), so what is measured is the ledger's own
work per call: one job's life (placed, started, replica exited with its consequence) written for many jobs
one after the other, as the services do, so no write ever waits for another one's turn. Prints one JSON
object: CPU microseconds per `record` call (the best of `--rounds`), and whether the ledger has turns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import gpuyard.shared.stores.ledger as ledger_module
from gpuyard.shared.contracts.events.jobs import (
    JobPlaced,
    JobReplicaExited,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.runtime.service import event_loop_factory
from gpuyard.shared.stores.events.base import AppendResult
from gpuyard.shared.stores.ledger import JobLedger


class InstantStore:
    """Every append succeeds at once; nothing is ever read back (the ledger wrote it all itself)."""

    async def read_stream(self, stream_id, *, after_version=0):
        return []

    async def append_many(self, appends):
        return [AppendResult(a.expected_version + len(a.events)) for a in appends]


async def one_round(jobs: int) -> float:
    ledger = JobLedger(InstantStore(), None, "/bench")
    spec = JobSpec(command="true")
    lives = []
    for n in range(jobs):
        j = f"job-{n}"
        lives.append(
            (
                j,
                [
                    JobSubmitted(job_id=j, name="n", tenant="t", user="u", spec=spec),
                    JobPlaced(job_id=j, attempt=1, placements=[ReplicaPlacement(replica=0, node="n1")]),
                    JobStarted(job_id=j, attempt=1, node="n1", replicas=[0]),
                ],
                JobReplicaExited(job_id=j, attempt=1, node="n1", replica=0, exit_code=0),
                JobSucceeded(job_id=j, attempt=1),
            )
        )
    started = time.process_time()
    calls = 0
    for j, events, exited, succeeded in lives:
        for data in events:
            await ledger.record(j, lambda _v, d=data: d, new=data is events[0], cached=True)
        await ledger.record(j, lambda _v, e=exited: e, then=lambda _v, s=succeeded: s, cached=True)
        calls += len(events) + 1
    return (time.process_time() - started) / calls * 1e6


async def main() -> dict:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    best = min([await one_round(args.jobs) for _ in range(args.rounds)])
    return {
        "ledger": ledger_module.__file__,
        "turns": hasattr(JobLedger(InstantStore(), None, "/x"), "_turns"),
        "record_cpu_us": round(best, 2),
    }


if __name__ == "__main__":
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        print(json.dumps(runner.run(main())))
