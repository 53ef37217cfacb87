"""GPUYARD on Slurm against Slurm alone, same cluster, same run: N trivial jobs submitted through GPUYARD (the
Slurm backend: API, scheduler, executor, `sbatch`) and the same N submitted with `sbatch` straight to the same
Slurm, one set after the other, in `--rounds` rounds (alternating which goes first). Each path takes its jobs
as fast as it can: GPUYARD's one POST after another (about 2 ms each), `sbatch` 8 calls at once (10-20 ms each).

Each job writes the time it starts (its first instruction) to a file; submit → running is that time less the
time its submission was sent, and the drain rate is N over the time from the first submission until every job is
over as its submitter sees it (GPUYARD: every job succeeded in the API; Slurm: `squeue` lists none of them as
pending or running). The cluster is the tests' (tests/integration/slurm/cluster.py: one node, 32 CPUs), each job
asks for one CPU and 16 MB, so at most 32 run at once on either path.

    python benchmarks/slurm.py [--jobs 200] [--rounds 3]

Prints one JSON object: per path and round, submit → running p50 and p90 (ms) and the drain rate (jobs/s), then
min / median / max over the rounds, and GPUYARD's cost over Slurm's own (percent of the p50 and of the rate);
also the p50 counted from the round's first submission (what a user who submits all N at once sees), and what slurmctld's
log says: submit → allocated p50, and in how many of its scheduler's passes the jobs were allocated. Each GPUYARD
round also says where its time went (`phases_p50_ms`: the median of each step of a job's path, from the event
store's times and the spool folder's, and the time from an end recorded to the next job placed).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.shared.contracts.jobstate import JobState  # noqa: E402
from tests.integration.conftest import Platform, wait_for  # noqa: E402
from tests.integration.slurm.cluster import CPUS, SlurmCluster  # noqa: E402
from tests.integration.slurm.conftest import start_platform  # noqa: E402

MEMORY = "16MiB"


def stamp_command(marks: Path, name: str) -> str:
    return f"date +%s.%N > {marks}/{name}"


def started_at(marks: Path, name: str) -> float:
    return float((marks / name).read_text().strip())


SBATCH_AT_ONCE = 8
"""`sbatch` calls side by side: one takes 10-20 ms, so one after another 200 jobs would take seconds to submit
(GPUYARD's API takes them in about 2 ms each), and the later jobs would wait in the client, where no submit →
running time counts them."""


def run_sbatch(cluster: SlurmCluster, marks: Path, jobs: int) -> dict:
    sent: dict[str, float] = {}

    def submit(i: int) -> str:
        name = f"s{i}"
        sent[name] = time.time()
        return cluster.sbatch(
            "-J", f"bench-{name}", "--mem=16M", "--cpus-per-task=1", "-o", "/dev/null",
            "--wrap", stamp_command(marks, name),
        )  # fmt: skip

    first = time.time()
    with ThreadPoolExecutor(SBATCH_AT_ONCE) as pool:
        wanted = set(pool.map(submit, range(jobs)))

    def over() -> bool:
        out = cluster.run(
            "squeue", "-h", "--states=PENDING,RUNNING,CONFIGURING,COMPLETING", "-o", "%i"
        ).stdout
        return not wanted & set(out.split())

    wait_for(over, 600, 0.05, "the sbatch jobs over")
    drained = time.time() - first
    return figures(marks, sent, drained, jobs)


def run_gpuyard(platform: Platform, marks: Path, jobs: int) -> dict:
    client = platform.client()
    sent: dict[str, float] = {}
    ids = []
    first = time.time()
    for i in range(jobs):
        name = f"g{i}"
        sent[name] = time.time()
        spec = {
            "name": name,
            "command": stamp_command(marks, name),
            "resources": {"cpus": 1, "memory": MEMORY},
        }
        ids.append(client.submit(spec).job_id)
    ours = set(ids)

    def over() -> bool:
        page = client.jobs(state=[JobState.QUEUED, JobState.PLACED, JobState.RUNNING], limit=500)
        return not ours & {job.job_id for job in page.items}

    wait_for(over, 600, 0.1, "the GPUYARD jobs over")
    drained = time.time() - first
    return {
        **figures(marks, sent, drained, jobs),
        "phases_p50_ms": phases(platform.data_dir, marks, sent, dict(zip(sent, ids, strict=True))),
    }


PHASES = (
    ("sent", "submitted"),
    ("submitted", "placed"),
    ("placed", "spool"),
    ("spool", "running"),
    ("running", "replica_exited"),
    ("replica_exited", "succeeded"),
)
"""GPUYARD's path of one job, step by step: sent (`POST /v1/jobs`), its events recorded (submitted, placed,
replica_exited, succeeded: the store's times), spool (its spool folder made: the executor's `sbatch` under way),
running (its first instruction, which is also about its end: the command is one `date`)."""


def phases(data: Path, marks: Path, sent: dict[str, float], ids: dict[str, str]) -> dict[str, float]:
    """The median of each step of `PHASES` over the jobs, ms: where GPUYARD's time goes."""
    store = sqlite3.connect(f"file:{data / 'events.db'}?mode=ro", uri=True)
    try:
        rows = store.execute("SELECT stream_id, type, recorded_at FROM events").fetchall()
    finally:
        store.close()
    recorded: dict[str, dict[str, float]] = {}
    for job_id, kind, at in rows:
        recorded.setdefault(job_id, {}).setdefault(kind.rsplit(".", 1)[-1], at)
    steps: dict[str, list[float]] = {}
    for name, job_id in ids.items():
        folder = data / "slurm" / job_id
        try:
            times = {
                "sent": sent[name],
                **recorded.get(job_id, {}),
                "spool": folder.stat().st_mtime,  # (its attempt's folder made in it)
                "running": started_at(marks, name),
            }
        except (OSError, ValueError):
            continue
        for before, after in PHASES:
            if before in times and after in times:
                steps.setdefault(f"{before}->{after}", []).append((times[after] - times[before]) * 1e3)
    # (a slot freed: the k-th end recorded lets the (k + CPUS)-th be placed: each job asks for one CPU)
    ends = sorted(recorded[i]["succeeded"] for i in ids.values() if "succeeded" in recorded.get(i, {}))
    placed = sorted(recorded[i]["placed"] for i in ids.values() if "placed" in recorded.get(i, {}))
    steps["succeeded->next placed"] = [(p - e) * 1e3 for e, p in zip(ends, placed[CPUS:], strict=False)]
    return {step: round(statistics.median(values), 1) for step, values in steps.items() if values}


SUBMITTED = re.compile(r"^\[(\S+)\] _slurm_rpc_submit_batch_job: JobId=(\d+)")
ALLOCATED = re.compile(r"^\[(\S+)\] sched(?:/backfill)?: (?:Allocate|_start_job: Started) JobId=(\d+)")


def slurm_allocations(log: Path, offset: int) -> dict:
    """What slurmctld's log says of the jobs submitted since `offset` (its size before the round): submit →
    allocated p50 (ms), and in how many passes of its scheduler they were allocated (distinct instants): Slurm
    starts a batch job at its scheduler's next pass, not when `sbatch` returns."""
    with log.open() as file:
        file.seek(offset)
        text = file.read()
    submitted: dict[str, float] = {}
    allocated: dict[str, float] = {}
    for line in text.splitlines():
        for pattern, into in ((SUBMITTED, submitted), (ALLOCATED, allocated)):
            if found := pattern.match(line):
                into.setdefault(found[2], datetime.fromisoformat(found[1]).timestamp())
    waits = [(allocated[i] - at) * 1e3 for i, at in submitted.items() if i in allocated]
    return {
        "slurm_submit_to_allocated_p50_ms": round(statistics.median(waits), 1) if waits else None,
        "slurm_allocation_passes": len({round(at, 2) for at in allocated.values()}),
    }


def figures(marks: Path, sent: dict[str, float], drained: float, jobs: int) -> dict:
    waits = sorted(
        (started_at(marks, name) - at) * 1e3 for name, at in sent.items() if (marks / name).exists()
    )
    first = min(sent.values())
    since_first = [(started_at(marks, name) - first) * 1e3 for name in sent if (marks / name).exists()]
    return {
        "jobs": jobs,
        "ran": len(waits),
        "submit_to_running_p50_ms": round(statistics.median(waits), 1),
        "submit_to_running_p90_ms": round(waits[int(len(waits) * 0.9) - 1], 1),
        # (the same from the first submission: a client that submits slower leaves its jobs waiting in itself)
        "first_submit_to_running_p50_ms": round(statistics.median(since_first), 1),
        "drain_jobs_per_s": round(jobs / drained, 2),
    }


def spread(values: list[float]) -> dict:
    return {"min": min(values), "median": round(statistics.median(values), 2), "max": max(values)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="gpuyard-bench-slurm-"))
    base.chmod(0o755)  # (munged, as its own user, reaches its folder inside)
    cluster = SlurmCluster(base / "slurm").start()
    platform = start_platform(cluster, base)
    rounds: dict[str, list[dict]] = {"sbatch": [], "gpuyard": []}
    try:
        for r in range(args.rounds):
            order = ["sbatch", "gpuyard"] if r % 2 == 0 else ["gpuyard", "sbatch"]
            for path in order:
                marks = base / f"marks-{path}-{r}"
                marks.mkdir()
                marks.chmod(0o777)
                log = cluster.folder / "log" / "slurmctld.log"
                offset = log.stat().st_size
                if path == "sbatch":
                    rounds[path].append(run_sbatch(cluster, marks, args.jobs))
                else:
                    rounds[path].append(run_gpuyard(platform, marks, args.jobs))
                rounds[path][-1].update(slurm_allocations(log, offset))
                print(path, r, rounds[path][-1], file=sys.stderr)
    finally:
        platform.stop()
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    summary = {
        path: {
            metric: spread([r[metric] for r in runs])
            for metric in (
                "submit_to_running_p50_ms",
                "submit_to_running_p90_ms",
                "first_submit_to_running_p50_ms",
                "drain_jobs_per_s",
            )
        }
        for path, runs in rounds.items()
    }
    p50 = {path: summary[path]["submit_to_running_p50_ms"]["median"] for path in rounds}
    rate = {path: summary[path]["drain_jobs_per_s"]["median"] for path in rounds}
    cost = {
        "p50_percent_over_slurm": round((p50["gpuyard"] / p50["sbatch"] - 1) * 100, 1),
        "drain_rate_percent_below_slurm": round((1 - rate["gpuyard"] / rate["sbatch"]) * 100, 1),
    }
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    print(
        json.dumps(
            {"commit": git, "jobs": args.jobs, "rounds": rounds, "summary": summary, "cost": cost}, indent=1
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
