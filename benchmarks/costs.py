"""What one message and one append cost a service, in CPU microseconds of the calling process (uvloop).

    python benchmarks/costs.py            # starts its own nats-server (JetStream) on a free port

- publish, waiting for each ack (`Bus.publish`) against sending without waiting (`Bus.send`, acks checked
  when they come): what the job ledger does since session 4;
- an append to the embedded SQLite store alone against appends that share a commit (group commit);
- starting a no-op job's process (`true`) and waiting for it: the CPU time of the child itself, which no
  platform process is charged with but which shares the same cores;
- folding one event into a job's view (`gpuyard.shared.contracts.jobstate.apply`, done by every service for every job event),
  averaged over a no-op job's life: submitted, placed, started, replica exited, succeeded.

Prints one JSON object; docs/benchmarks.md (Pipeline) quotes it.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from gpuyard.shared.bus.jetstream import Bus
from gpuyard.shared.contracts.events.envelope import derived_id, make_event
from gpuyard.shared.contracts.events.jobs import (
    GpuShare,
    JobPlaced,
    JobReplicaExited,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import apply
from gpuyard.shared.runtime.service import event_loop_factory
from gpuyard.shared.stores.events import Append
from gpuyard.shared.stores.events.sqlite import SqliteEventStore
from gpuyard.shared.stores.ledger import projection_of
from gpuyard.supervisor.natsserver import nats_server_binary
from gpuyard.supervisor.ports import free_ports

N = 2000
SPEC = JobSpec.model_validate(
    {"command": ["true"], "resources": {"gpus": 0.125, "cpus": 0.01, "memory": "1MB"}}
)


def events(prefix: str, n: int = N):
    return [
        make_event(
            JobSubmitted(job_id=f"{prefix}{i}", name="x", tenant="t", user="u", spec=SPEC),
            source="/bench",
            id=derived_id(prefix, i),
        )
        for i in range(n)
    ]


def per_op(started: float, n: int = N) -> float:
    return round((time.process_time() - started) / n * 1e6, 1)


async def store_costs(tmp: Path) -> dict:
    store = await SqliteEventStore.open(tmp / "events.db")
    result = {}
    for label, group in (("append_alone_us", 1), ("append_in_groups_of_10_us", 10)):
        appends = [Append(e.subject, 0, [e], projection_of(apply(None, e, version=1))) for e in events(label)]
        started = time.process_time()
        for k in range(0, N, group):
            await asyncio.gather(*(store.append_many([a]) for a in appends[k : k + group]))
        result[label] = per_op(started)
    await store.close()
    return result


def child_costs(n: int = 300) -> dict:
    before = os.times()
    for _ in range(n):
        subprocess.run(["true"], stdin=subprocess.DEVNULL, check=True)
    after = os.times()
    spent = after.children_user - before.children_user + after.children_system - before.children_system
    return {"noop_job_process_cpu_us": round(spent / n * 1e6, 1)}


def life(job_id: str) -> list:
    share = GpuShare(index=0, fraction=0.125)
    return [
        make_event(data, source="/bench")
        for data in (
            JobSubmitted(job_id=job_id, name="x", tenant="t", user="u", spec=SPEC),
            JobPlaced(
                job_id=job_id, attempt=1, placements=[ReplicaPlacement(replica=0, node="n", gpus=[share])]
            ),
            JobStarted(job_id=job_id, attempt=1, node="n", replicas=[0]),
            JobReplicaExited(job_id=job_id, attempt=1, node="n", replica=0, exit_code=0),
            JobSucceeded(job_id=job_id, attempt=1),
        )
    ]


def fold_costs(rounds: int = 5) -> dict:
    """The least of a few rounds: pure CPU work, which a busy machine can only make look slower."""
    lives = [life(f"life{i}") for i in range(N)]
    costs = []
    for _ in range(rounds):
        started = time.process_time()
        for events_of_job in lives:
            view = None
            for version, event in enumerate(events_of_job, 1):
                view = apply(view, event, version=version)
        costs.append(per_op(started, N * len(lives[0])))
    return {"state_machine_apply_us": min(costs)}


async def bus_costs(url: str) -> dict:
    bus = await Bus.connect([url], name="bench", source="/bench")
    await bus.ensure_streams()
    result = {}
    started = time.process_time()
    for event in events("waited"):
        await bus.publish(event)
    result["publish_waiting_for_each_ack_us"] = per_op(started)
    started = time.process_time()
    acks = [await bus.send(event) for event in events("sent")]
    await asyncio.gather(*acks)
    result["send_acks_checked_later_us"] = per_op(started)

    await bus.close()
    return result


async def main() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        (port,) = free_ports("127.0.0.1", 1)
        server = subprocess.Popen(  # noqa: ASYNC220 (started once, before anything is measured)
            [nats_server_binary(), "-js", "-p", str(port), "-sd", str(Path(tmp) / "nats")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            await asyncio.sleep(0.5)
            return {
                **child_costs(),
                **fold_costs(),
                **await store_costs(Path(tmp)),
                **await bus_costs(f"nats://127.0.0.1:{port}"),
            }
        finally:
            server.terminate()
            server.wait(10)


if __name__ == "__main__":
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        print(json.dumps(runner.run(main()), indent=2))
