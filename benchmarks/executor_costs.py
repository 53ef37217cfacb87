"""What the executor costs per job, in CPU microseconds of its own process: the real `Executor` with the local
backend over a real embedded store, no NATS (the unit tests' harness), no-op jobs (`true`) placed in bursts.

    python benchmarks/executor_costs.py [--jobs 600] [--burst 50] [--profile [--top 15]]

Per job: submitted and placed (as the scheduler would), started, its replica's exit recorded with
`job.succeeded`, and that end delivered back to the executor (as the bus would). `total_us` is the process's
CPU time per job over the whole run (the store's appends included, the children's own CPU not), split into
`user_us` (the Python code: what the executor's own code changes) and `system_us` (the kernel's: process
starts, pipes and files, which varies from run to run on a VM);
`reaper_us` is the CPU of the executor's reaper per job (the process that starts each replica and records its
end, `services/executor/reaper/`; its children's own CPU not counted), `node_us` = `total_us` + `reaper_us`;
`executor_us` is, with --profile, the CPU spent in the functions of services/executor itself (cProfile
`tottime`, inflated by the profiler); `--top N` adds `top_cumulative_us`: the N functions with the most
cumulative time per job (their callees included: `posix_spawn`, SQLite's `execute`, `os.mkdir`, reading the
job...), each with its calls per job, under the profiler. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import resource
import tempfile
import time
from pathlib import Path

from gpuyard.services.executor.local import LocalBackend
from gpuyard.shared.contracts.events.jobs import JobSucceeded
from gpuyard.shared.runtime.service import event_loop_factory
from tests.unit.services.executor.harness import Harness

ROOT = Path(__file__).resolve().parents[1]


async def run(jobs: int, burst: int, profiler: cProfile.Profile | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        h = await Harness(Path(tmp)).open()
        ex = await h.executor()
        assert isinstance(ex.backend, LocalBackend)
        ids = [await h.submit(command=["true"]) for _ in range(jobs)]  # (not measured)
        reaper = getattr(ex.backend, "reaper", None)
        reaper_before = process_cpu(reaper.pid) if reaper else 0.0
        started, times = time.process_time(), resource.getrusage(resource.RUSAGE_SELF)
        if profiler:
            profiler.enable()
        for k in range(0, jobs, burst):
            batch = ids[k : k + burst]
            await asyncio.gather(*(h.place(ex, job) for job in batch))
            await asyncio.wait(list(ex.backend.watchers))  # each ends once its replica's exit is recorded
            for job in batch:
                await h.deliver(ex, JobSucceeded(job_id=job, attempt=1))
        if profiler:
            profiler.disable()
        cpu = time.process_time() - started
        after = resource.getrusage(resource.RUSAGE_SELF)
        reaper_cpu = process_cpu(reaper.pid) - reaper_before if reaper else 0.0
        user, system = after.ru_utime - times.ru_utime, after.ru_stime - times.ru_stime
        states = {(await h.view(job)).state.value for job in ids}
        assert states == {"succeeded"}, states
        await h.close()
    return {
        "jobs": jobs,
        "burst": burst,
        "total_us": round(cpu / jobs * 1e6, 1),
        "user_us": round(user / jobs * 1e6, 1),
        "system_us": round(system / jobs * 1e6, 1),
        "reaper_us": round(reaper_cpu / jobs * 1e6, 1),
        "node_us": round((cpu + reaper_cpu) / jobs * 1e6, 1),
    }


def process_cpu(pid: int) -> float:
    """Seconds of CPU a process has used (user + system, its children's not), from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def executor_tottime(profiler: cProfile.Profile) -> float:
    stats = pstats.Stats(profiler)
    folder = str(ROOT / "services" / "executor")
    return sum(tt for (path, _, _), (_, _, tt, _, _) in stats.stats.items() if path.startswith(folder))


def top_cumulative(profiler: cProfile.Profile, jobs: int, n: int) -> list[dict]:
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][3])
    out = []
    for (path, line, name), (_, calls, _, cumulative, _) in rows:
        if name in ("<module>", "run", "_run_once", "select") or path.endswith(
            ("base_events.py", "runners.py")
        ):
            continue  # the loop and the benchmark itself, which contain everything
        where = Path(path).name if path != "~" else "builtin"
        out.append(
            {
                "function": f"{where}:{line}:{name}",
                "us_per_job": round(cumulative / jobs * 1e6, 1),
                "calls_per_job": round(calls / jobs, 2),
            }
        )
        if len(out) == n:
            break
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--burst", type=int, default=50)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=0, help="with --profile: the N largest cumulative times")
    args = parser.parse_args()
    profiler = cProfile.Profile(time.process_time) if args.profile else None  # CPU, not wall time
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        result = runner.run(run(args.jobs, args.burst, profiler))
    if profiler:
        result["executor_us"] = round(executor_tottime(profiler) / args.jobs * 1e6, 1)
        if args.top:
            result["top_cumulative_us"] = top_cumulative(profiler, args.jobs, args.top)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
