"""GPUYARD on Slurm against Slurm alone, same cluster, same run: N trivial jobs submitted through GPUYARD (the
Slurm backend: API, scheduler, executor, `sbatch`) and the same N submitted with `sbatch` straight to the same
Slurm, one set after the other, in `--rounds` rounds (alternating which goes first).

Each job writes the time it starts (its first instruction) to a file; submit → running is that time less the
time its submission was sent, and the drain rate is N over the time from the first submission until every job is
over as its submitter sees it (GPUYARD: every job succeeded in the API; Slurm: `squeue` lists none of them as
pending or running). The cluster is the tests' (tests/integration/slurm/cluster.py: one node, 32 CPUs), each job
asks for one CPU and 16 MB, so at most 32 run at once on either path.

    python benchmarks/slurm.py [--jobs 200] [--rounds 3]

Prints one JSON object: per path and round, submit → running p50 and p90 (ms) and the drain rate (jobs/s), then
min / median / max over the rounds, and GPUYARD's cost over Slurm's own (percent of the p50 and of the rate).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpuyard.shared.contracts.jobstate import JobState  # noqa: E402
from tests.integration.conftest import Platform, wait_for  # noqa: E402
from tests.integration.slurm.cluster import SlurmCluster  # noqa: E402
from tests.integration.slurm.conftest import start_platform  # noqa: E402

MEMORY = "16MiB"


def stamp_command(marks: Path, name: str) -> str:
    return f"date +%s.%N > {marks}/{name}"


def started_at(marks: Path, name: str) -> float:
    return float((marks / name).read_text().strip())


def run_sbatch(cluster: SlurmCluster, marks: Path, jobs: int) -> dict:
    sent: dict[str, float] = {}
    first = time.time()
    ids = []
    for i in range(jobs):
        name = f"s{i}"
        sent[name] = time.time()
        ids.append(
            cluster.sbatch(
                "-J",
                f"bench-{name}",
                "--mem=16M",
                "--cpus-per-task=1",
                "-o",
                "/dev/null",
                "--wrap",
                stamp_command(marks, name),
            )  # fmt: skip
        )
    wanted = set(ids)

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
    return figures(marks, sent, drained, jobs)


def figures(marks: Path, sent: dict[str, float], drained: float, jobs: int) -> dict:
    waits = sorted(
        (started_at(marks, name) - at) * 1e3 for name, at in sent.items() if (marks / name).exists()
    )
    return {
        "jobs": jobs,
        "ran": len(waits),
        "submit_to_running_p50_ms": round(statistics.median(waits), 1),
        "submit_to_running_p90_ms": round(waits[int(len(waits) * 0.9) - 1], 1),
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
                if path == "sbatch":
                    rounds[path].append(run_sbatch(cluster, marks, args.jobs))
                else:
                    rounds[path].append(run_gpuyard(platform, marks, args.jobs))
                print(path, r, rounds[path][-1], file=sys.stderr)
    finally:
        platform.stop()
        cluster.stop()
        shutil.rmtree(base, ignore_errors=True)
    summary = {
        path: {
            metric: spread([r[metric] for r in runs])
            for metric in ("submit_to_running_p50_ms", "submit_to_running_p90_ms", "drain_jobs_per_s")
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
