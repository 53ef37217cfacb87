"""Where the held cycle's time goes: the speed benchmark's full-cluster cycle under cProfile.

    python benchmarks/cycle_profile.py [--waiting 10000] [--nodes 1000] [--cycles 20] [--top 20] [--depth K]

The case of `benchmarks/scheduler.py --only speed` ("one cycle, 10,000 waiting jobs, full 1,000-node cluster,
cluster held in a `HeldCluster`"), built with that file's own functions: a first cycle indexes the cluster
(not profiled), then each profiled cycle follows one change (a running job ends, another starts on its GPU).
Prints one JSON object: the CPU time per cycle without and with the profiler, and the functions of the
scheduler core with the most cumulative time (callees included, so the rows overlap), as a share of the
profiled cycle. cProfile adds a cost per Python call, so code that makes many small calls (the loop over
the waiting jobs) looks larger than it is; the shares are a map, the timings come from the speed benchmark.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import time
from dataclasses import replace
from pathlib import Path

from gpuyard.shared import scheduling
from gpuyard.shared.scheduling import Allocation, HeldCluster, SchedulerConfig

# imported as benchmarks.cycle_profile (python -m, a test), or run as a script: its own folder first on the path
if __package__:
    from benchmarks import scheduler as bench
else:
    import scheduler as bench

CORE = str(Path(scheduling.__file__).parent) + os.sep  # the scheduling core's files (its sim/ included)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--waiting", type=int, default=10_000)
    parser.add_argument("--cycles", type=int, default=20)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--depth", type=int, help="reservation_depth (default: the core's default)")
    args = parser.parse_args()
    config = SchedulerConfig()
    if args.depth is not None:
        config = replace(config, reservation_depth=args.depth)
    queue = bench.waiting_jobs(args.waiting)
    state = bench.full_cluster(args.nodes)
    held = HeldCluster()
    for node in bench.make_cluster(args.nodes).values():
        held.put_node(node)
    for alloc in state.running:
        held.put(alloc)
    bench.decide_held(held, queue, config, state.now)

    def cycle(k: int) -> None:
        ended = state.running[k]
        held.drop(ended.job.job_id)
        held.put(Allocation(replace(ended.job, job_id=f"next-{k}"), ended.replicas, state.now))
        bench.decide_held(held, queue, config, state.now)

    started = time.process_time()
    for k in range(args.cycles):
        cycle(k)
    plain = (time.process_time() - started) / args.cycles
    profiler = cProfile.Profile()
    started = time.process_time()
    profiler.enable()
    for k in range(args.cycles, 2 * args.cycles):
        cycle(k)
    profiler.disable()
    profiled = (time.process_time() - started) / args.cycles
    stats = pstats.Stats(profiler).stats
    total = sum(tt for (_, _, _), (_, _, tt, _, _) in stats.items())
    rows = sorted(
        ((key, value) for key, value in stats.items() if key[0].startswith(CORE)), key=lambda kv: -kv[1][3]
    )
    top = [
        {
            "function": f"{Path(path).name}:{line}:{name}",
            "share_pct": round(100 * cumulative / total, 1),
            "calls_per_cycle": round(calls / args.cycles, 1),
        }
        for (path, line, name), (_, calls, _, cumulative, _) in rows[: args.top]
    ]
    result = {
        "nodes": args.nodes,
        "waiting": args.waiting,
        "cycles": args.cycles,
        "reservation_depth": config.reservation_depth,
        "cpu_ms_per_cycle": round(plain * 1e3, 1),
        "cpu_ms_per_cycle_profiled": round(profiled * 1e3, 1),
        "top_cumulative": top,
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
