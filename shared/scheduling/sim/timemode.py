"""Time-based replay: tasks arrive at creation_time, queue, run for their trace runtime, and leave.

Every scheduling decision is the core's `decide` on a capacity index kept across events (a virtual clock, no
processes). Runtime of a task = deletion_time - scheduled_time; when scheduled_time is missing (the task was
never scheduled in production) deletion_time - creation_time; when neither is valid (missing or negative),
the median of the valid runtimes; at least 1 second. Tasks without a creation_time are skipped (counted).
Arrival times may be divided by a speed-up factor to raise the offered load (runtimes stay as they are).
Each task's time limit (`timeout`, which backfill and start estimates use) is its runtime times
`limit_factor` (1.0 = users state exact limits).

Speed-up, documented because it is the one place the replay is not a plain loop: a cycle in which nothing
left the cluster (capacity only shrank) considers only the new arrivals plus the jobs that were blocked first
in the previous cycle (as many as hold reservations, `reservation_depth`, at least one: their reservations
still govern backfill); everything else failed on a larger capacity. Not with scarce nodes kept
(`SchedulerConfig.keep_scarce_nodes`, `core/scarcity.py`): which nodes a job may use depends on every waiting
job, so then every cycle looks at every waiting job. `FULL_CYCLES = True` turns the shortcut off for every
configuration. The shortcut is not exact in every case: a job that fitted but would have delayed a
reservation (`backfill_would_delay`) and no longer fits after later placements is blocked on resources in the
next full cycle and may take one of the reservations that the shortcut's cycle gives to a job behind it. The
replays of docs/benchmarks.md without scarce nodes kept give the same summary either way on sub-clusters 2
and 5 (`benchmarks/replay.py --policies gpuyard:scarce=off --offsets 2,5 --full-cycles`).

GPU allocation is reported over the arrival window (`gpu_allocation_mean_pct`: the time-weighted mean share of
the cluster's GPUs allocated while jobs arrive), the one definition the simulator's tables and the benchmarks
use. The window runs from the 1st to the 99th percentile of the arrival times (`ARRIVAL_WINDOW`): the openb
files hold a few pods created months before the rest (about 30 of 8,152 in the 115 days before the dense part
of the default file, pods still running when the trace was taken), and from the first arrival to the last
the window would be three quarters empty. Averaged over the makespan instead (`gpu_allocation_makespan_pct`),
one job that runs for months after the last arrival hides the contention altogether (2.4% where the arrival
window shows 75%).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from gpuyard.shared.contracts.reasons import RESOURCE_CODES, PendingCode
from gpuyard.shared.scheduling import decide
from gpuyard.shared.scheduling.model import Allocation, JobRequest, SchedulerConfig
from gpuyard.shared.scheduling.sim.cluster import node_index
from gpuyard.shared.scheduling.sim.trace import NodeTable, PodTable

FULL_CYCLES = False  # every cycle looks at every waiting job (the shortcut below off)
LONG_WAIT_S = 3600.0  # a wait longer than this is counted on its own (`waits_over_1h`)
ARRIVAL_WINDOW = (1.0, 99.0)  # percentiles of the arrival times between which allocation is measured


@dataclass(slots=True)
class TimeRun:
    policy: str
    jobs: int
    skipped: int
    never_started: int
    jct: np.ndarray  # seconds, finished jobs
    wait: np.ndarray  # seconds, started jobs
    makespan: float
    allocation_mean: float  # time-weighted mean share of GPUs allocated in the arrival window, %
    allocation_makespan: float  # the same from the first arrival to the last end, %
    preemptions: int
    timeline: dict[str, list[float]] = field(default_factory=dict)  # t, allocated %, queue length
    seconds: float = 0.0
    first_arrival: float = 0.0  # seconds on the replay's clock (arrival times divided by the speed-up)
    last_arrival: float = 0.0
    last_start: float = 0.0  # the last placement; afterwards only running jobs end
    waits: dict[str, float] = field(default_factory=dict)  # job id -> seconds from arrival to first start

    def summary(self) -> dict:
        def stat(a: np.ndarray, fn) -> float | None:
            return float(fn(a)) if a.size else None

        return {
            "policy": self.policy,
            "jobs": self.jobs,
            "skipped": self.skipped,
            "never_started": self.never_started,
            "avg_jct_s": stat(self.jct, np.mean),
            "median_jct_s": stat(self.jct, np.median),
            "p95_jct_s": stat(self.jct, lambda a: np.percentile(a, 95)),
            "avg_wait_s": stat(self.wait, np.mean),
            "median_wait_s": stat(self.wait, np.median),
            "p95_wait_s": stat(self.wait, lambda a: np.percentile(a, 95)),
            "p99_wait_s": stat(self.wait, lambda a: np.percentile(a, 99)),
            "p99_9_wait_s": stat(self.wait, lambda a: np.percentile(a, 99.9)),
            "longest_wait_s": stat(self.wait, np.max),
            "waits_over_1h": int(np.count_nonzero(self.wait > LONG_WAIT_S)),
            "makespan_s": self.makespan,
            "gpu_allocation_mean_pct": self.allocation_mean,
            "gpu_allocation_makespan_pct": self.allocation_makespan,
            "preemptions": self.preemptions,
            "seconds": self.seconds,
            "first_arrival_s": self.first_arrival,
            "last_arrival_s": self.last_arrival,
            "last_start_s": self.last_start,
        }


def runtimes(pods: PodTable) -> np.ndarray:
    run = pods.deletion - pods.scheduled
    fallback = pods.deletion - pods.creation
    run = np.where(
        np.isfinite(run) & (run >= 0),
        run,
        np.where(np.isfinite(fallback) & (fallback >= 0), fallback, np.nan),
    )
    valid = run[np.isfinite(run)]
    median = float(np.median(valid)) if valid.size else 3600.0
    return np.maximum(np.where(np.isfinite(run), run, median), 1.0)


def trace_jobs(
    pods: PodTable, limit_factor: float = 1.0, speedup: float = 1.0
) -> tuple[list[JobRequest], dict[str, float], int]:
    """JobRequests, their runtimes, and how many tasks were skipped. Arrival times are divided by `speedup`
    (runtimes are not), which raises the offered load: the openb sample alone keeps its cluster ~0.2% busy."""
    if not pods.has_times:
        raise ValueError("time mode needs creation_time/deletion_time columns; this pod file has none")
    run = runtimes(pods)
    jobs, duration, skipped = [], {}, 0
    for k, name in enumerate(pods.names):
        created = pods.creation[k]
        if not np.isfinite(created):
            skipped += 1
            continue
        count, milli = int(pods.num_gpu[k]), int(pods.gpu_milli[k])
        gpus = 0.0 if not count else (float(count) if milli >= 1000 or count > 1 else milli / 1000)
        jobs.append(
            JobRequest(
                name,
                "trace",
                gpus=gpus,
                cpus=float(np.nan_to_num(pods.cpus[k])),
                memory=int(np.nan_to_num(pods.memory[k])),
                gpu_models=pods.gpu_spec[k],
                submitted_at=float(created) / speedup,
                timeout=float(run[k] * limit_factor),
            )
        )
        duration[name] = float(run[k])
    jobs.sort(key=lambda j: (j.submitted_at, j.job_id))
    return jobs, duration, skipped


def run_time(
    nodes: NodeTable,
    pods: PodTable,
    name: str,
    config: SchedulerConfig,
    limit_factor: float = 1.0,
    speedup: float = 1.0,
    progress: Callable[[int], None] | None = None,
) -> TimeRun:
    started = time.perf_counter()
    jobs, duration, skipped = trace_jobs(pods, limit_factor, speedup)
    replay = _Replay(nodes, jobs, duration, config)
    while replay.k < len(jobs) or replay.ends:
        t = min(
            jobs[replay.k].submitted_at if replay.k < len(jobs) else np.inf,
            replay.ends[0][0] if replay.ends else np.inf,
        )
        replay.advance_to(t)
        freed = replay.release_ended(t)
        arrivals = replay.admit_arrived(t)
        if progress is not None and arrivals:
            progress(len(arrivals))
        considered = replay.considered(arrivals, freed)
        if considered:
            replay.cycle(considered, t)
        replay.note(t)
        if replay.k >= len(jobs) and not replay.ends and replay.queue:
            break  # what is left can never start
    return replay.run(name, skipped, time.perf_counter() - started)


class _Replay:
    """The state of one time replay: the cluster's index, the running jobs and their ends, the queue, and the
    figures gathered on the way (starts, ends, the allocated GPU area over time)."""

    def __init__(
        self, nodes: NodeTable, jobs: list[JobRequest], duration: dict[str, float], config: SchedulerConfig
    ) -> None:
        self.jobs, self.duration, self.config = jobs, duration, config
        self.index = node_index(nodes)
        self.capacity = float(nodes.total_gpus * 1000) or 1.0
        self.arrival = {j.job_id: j.submitted_at for j in jobs}
        self.running: dict[str, tuple[Allocation, float]] = {}
        self.ends: list[tuple[float, str]] = []
        self.queue: dict[str, JobRequest] = {}
        self.first_start: dict[str, float] = {}
        self.last_start = jobs[0].submitted_at if jobs else 0.0
        self.finished: dict[str, float] = {}
        self.preemptions = 0
        self.allocated = 0.0
        self.timeline: dict[str, list[float]] = {"t": [], "allocated_pct": [], "queue": []}
        self.area = self.window_area = 0.0
        self.last_t = jobs[0].submitted_at if jobs else 0.0
        self.window_start, self.window_end = arrival_window(jobs)
        self.holders: list[str] = []  # the first jobs blocked on resources last cycle (reservations)
        self.depth = max(1, config.reservation_depth)
        self.scarce = config.keep_scarce_nodes  # every cycle looks at every waiting job (see the module)
        self.k = 0

    def advance_to(self, t: float) -> None:
        self.area += self.allocated * (t - self.last_t)
        self.window_area += self.allocated * max(
            0.0, min(t, self.window_end) - max(self.last_t, self.window_start)
        )
        self.last_t = t

    def release_ended(self, t: float) -> bool:
        """Release the jobs that ended by `t`; whether any did."""
        freed = False
        while self.ends and self.ends[0][0] <= t:
            _, job_id = heapq.heappop(self.ends)
            alloc, _ = self.running.pop(job_id)
            self.index.release(alloc.replicas)
            self.allocated -= alloc.job.total_gpus * 1000
            self.finished[job_id] = t
            freed = True
        return freed

    def admit_arrived(self, t: float) -> list[JobRequest]:
        arrivals = []
        jobs = self.jobs
        while self.k < len(jobs) and jobs[self.k].submitted_at <= t:
            self.queue[jobs[self.k].job_id] = jobs[self.k]
            arrivals.append(jobs[self.k])
            self.k += 1
        return arrivals

    def considered(self, arrivals: list[JobRequest], freed: bool) -> list[JobRequest]:
        """The jobs this cycle looks at: every waiting job, or after a cycle in which nothing left, only the
        reservation holders and the new arrivals (the shortcut of the module's description)."""
        queue, holders = self.queue, self.holders
        if FULL_CYCLES or self.scarce or freed or not holders or any(h not in queue for h in holders):
            return list(queue.values())
        return [*(queue[h] for h in holders), *arrivals]

    def cycle(self, considered: list[JobRequest], t: float) -> None:
        result = decide(self.index, [a for a, _ in self.running.values()], considered, self.config, {}, t)
        for p in result.placements:
            job = self.queue.pop(p.job_id)
            end = t + self.duration[p.job_id]
            self.running[p.job_id] = (Allocation(job, p.replicas, t), end)
            heapq.heappush(self.ends, (end, p.job_id))
            self.allocated += job.total_gpus * 1000
            self.first_start.setdefault(p.job_id, t)
            self.last_start = t
        for pre in result.preemptions:  # victims leave now and start over later (their work is lost)
            alloc, _ = self.running.pop(pre.job_id)
            self.ends.remove((_end_of(self.ends, pre.job_id), pre.job_id))
            heapq.heapify(self.ends)
            self.index.release(alloc.replicas)
            self.allocated -= alloc.job.total_gpus * 1000
            self.queue[pre.job_id] = alloc.job
            self.preemptions += 1
        blocked = sorted(
            ((j, r) for j, r in result.pending.items() if _resource_blocked(r.code)),
            key=lambda kv: kv[1].position or 0,  # (a job blocked on resources has its place in line)
        )
        self.holders = [j for j, _ in blocked][: self.depth]

    def note(self, t: float) -> None:
        self.timeline["t"].append(t)
        self.timeline["allocated_pct"].append(100.0 * self.allocated / self.capacity)
        self.timeline["queue"].append(float(len(self.queue)))

    def run(self, name: str, skipped: int, seconds: float) -> TimeRun:
        jobs, arrival, capacity = self.jobs, self.arrival, self.capacity
        first = jobs[0].submitted_at if jobs else 0.0
        span = max(self.last_t - first, 1e-9)
        window = self.window_end - self.window_start
        jct = np.array([self.finished[j] - arrival[j] for j in self.finished])
        wait = np.array([self.first_start[j] - arrival[j] for j in self.first_start])
        never = len(self.queue)
        if never:  # count what never started as waiting until the end of the replay
            wait = np.concatenate([wait, [self.last_t - arrival[j] for j in self.queue]])
        makespan_pct = float(100.0 * self.area / capacity / span)
        return TimeRun(
            name,
            len(jobs),
            skipped,
            never,
            jct,
            wait,
            float(max(self.finished.values(), default=first) - first),
            float(100.0 * self.window_area / capacity / window) if window > 0 else makespan_pct,
            makespan_pct,
            self.preemptions,
            _thin(self.timeline),
            seconds,
            first,
            jobs[-1].submitted_at if jobs else 0.0,
            self.last_start,
            {j: self.first_start[j] - arrival[j] for j in self.first_start},
        )


def arrival_window(jobs: list[JobRequest]) -> tuple[float, float]:
    """(start, end) of the arrival window: the `ARRIVAL_WINDOW` percentiles of the jobs' arrival times."""
    if not jobs:
        return 0.0, 0.0
    low, high = np.percentile([j.submitted_at for j in jobs], ARRIVAL_WINDOW)
    return float(low), float(high)


def _end_of(ends: list[tuple[float, str]], job_id: str) -> float:
    return next(t for t, j in ends if j == job_id)


def _resource_blocked(code: PendingCode) -> bool:
    return code in RESOURCE_CODES


def _thin(timeline: dict[str, list[float]], points: int = 2000) -> dict[str, list[float]]:
    n = len(timeline["t"])
    if n <= points:
        return timeline
    keep = np.linspace(0, n - 1, points).astype(int)
    return {key: [values[i] for i in keep] for key, values in timeline.items()}
