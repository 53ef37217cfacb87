"""What counting the bus figures (`gpuyard.shared.bus.metrics`) adds to the handling of one message, in nanoseconds of
CPU per message, without a server: messages go through a durable consumer's loop (`PullConsumer.dispatch`:
decode, handler, ack) and a watch's (`Watch._delivered`), with a handler that does nothing, once with the
figures counted and once with figures that count nothing. The difference is the cost of counting; a real
handler (a store write, a process start) costs tens of microseconds to milliseconds more.

    python benchmarks/bus_overhead.py [--messages 50000] [--rounds 5]

Prints one JSON object: per path, the median ns per message of each variant over the rounds, and the
difference, and each variant's fastest and slowest round (`counted_ns_min`, `counted_ns_max`,
`uncounted_ns_min`, `uncounted_ns_max`: how far the rounds spread on a shared machine); docs/operations.md
("Metrics of each service") quotes it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from gpuyard.shared.bus.consumers import PullConsumer
from gpuyard.shared.bus.watches import Watch
from gpuyard.shared.contracts.events.envelope import make_event, subject_of
from gpuyard.shared.contracts.events.jobs import JobCancelRequested
from gpuyard.shared.runtime.service import event_loop_factory
from tests.unit.shared.bus.bus_fakes import FakeBus, FakeMsg


class Uncounted:
    """Figures that count nothing: the consumer loops as they were before the counting."""

    name = "uncounted"

    def count(self, subject: str, outcome: str) -> None:
        pass

    def observe(self, seconds: float) -> None:
        pass


async def nothing(event, msg) -> None:
    pass


def messages(n: int) -> list[FakeMsg]:
    out = []
    for i in range(n):
        event = make_event(JobCancelRequested(job_id=f"job-{i % 64}", by="ana"), source="/bench")
        out.append(FakeMsg(subject_of(event, ("vision", "nlp")[i % 2]), event.to_json(), seq=i + 1))
    return out


async def through_consumer(msgs: list[FakeMsg], counted: bool) -> float:
    consumer = PullConsumer(FakeBus(), "EVENTS", "bench", nothing, max_deliver=5, batch=256)
    if not counted:
        consumer.figures = Uncounted()
    for msg in msgs:
        msg.ack_seen.clear()
    started = time.process_time_ns()
    for msg in msgs:
        await consumer.dispatch(msg)
    elapsed = time.process_time_ns() - started
    await asyncio.wait_for(msgs[-1].ack_seen.wait(), 10)  # the acks still to leave, out of the timing
    await asyncio.gather(*consumer.ack_tasks)
    return elapsed / len(msgs)


async def through_watch(msgs: list[FakeMsg], counted: bool) -> float:
    watch = Watch(FakeBus(), "EVENTS", ["job.cancel_requested.*"], nothing, since=None, name="bench")
    if not counted:
        watch.figures = Uncounted()
    started = time.process_time_ns()
    for msg in msgs:
        await watch._delivered(msg)
    return (time.process_time_ns() - started) / len(msgs)


async def measure(n: int, rounds: int) -> dict:
    msgs = messages(n)
    results: dict[str, dict[str, list[float]]] = {}
    for path, run in (("durable_consumer", through_consumer), ("watch", through_watch)):
        runs = results.setdefault(path, {"uncounted": [], "counted": []})
        await run(msgs[: n // 10], True)  # warm-up: imports, caches, label children
        for _ in range(rounds):
            for counted in (False, True):  # alternated: a busy moment of the machine falls on both
                runs["counted" if counted else "uncounted"].append(await run(msgs, counted))
    out = {"messages": n, "rounds": rounds}
    for path, runs in results.items():
        uncounted, counted = statistics.median(runs["uncounted"]), statistics.median(runs["counted"])
        out[path] = {
            "uncounted_ns_per_message": round(uncounted),
            "counted_ns_per_message": round(counted),
            "counting_ns_per_message": round(counted - uncounted),
            "counting_share": round((counted - uncounted) / uncounted, 3),
        }
        for variant in ("counted", "uncounted"):
            out[path][f"{variant}_ns_min"] = round(min(runs[variant]))
            out[path][f"{variant}_ns_max"] = round(max(runs[variant]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        print(json.dumps(runner.run(measure(args.messages, args.rounds)), indent=2))


if __name__ == "__main__":
    main()
