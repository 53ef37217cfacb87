"""The dashboard's jobs page with 10,000 jobs in the store: `GET /v1/jobs?limit=50` over the real app.

    python benchmarks/dashboard_jobs.py                     # 10,000 jobs, 30 runs of each request
    python benchmarks/dashboard_jobs.py --jobs 1000 --runs 10

A fresh embedded SQLite store in a temporary data directory is filled with `--jobs` jobs of eight tenants
(their events and projections written through the store's API as the services write them, 500 jobs to a
transaction): 70 % ended (succeeded, failed, cancelled), 10 % running, 20 % queued, submitted a second apart.
Then each request of the jobs page is timed over the submit service's ASGI app (the real app and store, no
network) with an httpx client, an admin's token: the first page, a later page (its cursor from the page before
it), a state filter, a search, a search that finds nothing (the whole table read), the same oldest first, and a
tenant's own list; and `GET /v1/tenants` with `--running` of the jobs running (1,000 by default) beside the
rest. Prints a markdown table of wall milliseconds (min / median / max of `--runs`), the machine's load average
with it.

    python benchmarks/dashboard_jobs.py --appends-only                   # what the listing's index costs writes
    PYTHONPATH=/path/to/other/checkout python benchmarks/dashboard_jobs.py --appends-only   # to compare

`--appends-only`: CPU microseconds per ledger append (`JobLedger.append`) over the life of 1,500 jobs
(submitted, placed, started, succeeded: each a projection written, its indexes updated) on a fresh store
without fsync, the best of three rounds; it needs only the store and the ledger, so an older checkout runs it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx

from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.context import SubmitContext
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    FailureReason,
    GpuShare,
    JobCancelled,
    JobFailed,
    JobPlaced,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState, apply
from gpuyard.shared.stores.events import Append, open_store
from gpuyard.shared.stores.ledger import JobLedger, projection_of
from gpuyard.shared.stores.logs import open_log_store

TENANTS = ["vision", "nlp", "audio", "robotics", "speech", "search", "ads", "infra"]
USERS = ["ana", "bo", "cy", "dee", "eli"]
BATCH = 500
ADMIN = {"Authorization": "Bearer tok-admin"}
VISION = {"Authorization": "Bearer tok-vision"}


def job_events(n: int, start: datetime, running: set[int], queued: set[int]):
    """Job n's events, as the services write them: submitted, then placed and started, then how it ended."""
    job_id = f"{n:08x}{'job':0>8}"
    tenant, user = TENANTS[n % len(TENANTS)], USERS[n % len(USERS)]
    at = start + timedelta(seconds=n)
    spec = JobSpec(name=f"train-{n % 97}", command="python train.py", resources={"gpus": 1 + n % 2})
    steps = [JobSubmitted(job_id=job_id, name=spec.name, tenant=tenant, user=user, spec=spec)]
    if n not in queued:
        shares = [GpuShare(index=i) for i in range(1 + n % 2)]
        placement = ReplicaPlacement(replica=0, node=f"node-{n % 125}", gpus=shares)
        steps += [
            JobPlaced(job_id=job_id, attempt=1, placements=[placement], borrowed=n % 5 == 0),
            JobStarted(job_id=job_id, attempt=1, node=placement.node, replicas=[0]),
        ]
        if n not in running:
            ending = n % 7
            if ending == 0:
                steps.append(
                    JobFailed(
                        job_id=job_id,
                        attempt=1,
                        reason=FailureReason.EXIT_CODE,
                        exit_code=1,
                        message="exited with 1",
                    )
                )
            elif ending == 1:
                steps.append(JobCancelled(job_id=job_id, attempt=1, by=user))
            else:
                steps.append(JobSucceeded(job_id=job_id, attempt=1))
    events = [
        make_event(data, source="/bench", time=at + timedelta(milliseconds=10 * i))
        for i, data in enumerate(steps)
    ]
    view = None
    for version, event in enumerate(events, 1):
        view = apply(view, event, version=version)
    return Append(job_id, 0, events, projection_of(view))


async def fill(store, jobs: int, running_jobs: int) -> None:
    start = datetime.now(UTC) - timedelta(seconds=jobs + 60)
    running = set(range(jobs - running_jobs, jobs))  # the newest are still running, or queued
    queued = set(range(jobs - running_jobs - jobs // 5, jobs - running_jobs))
    for first in range(0, jobs, BATCH):
        appends = [job_events(n, start, running, queued) for n in range(first, min(first + BATCH, jobs))]
        for result in await store.append_many(appends):
            assert not isinstance(result, Exception), result


def store_filters(params: dict, tenant: str | None) -> dict:
    """The store's filters of a listing's query parameters, as `GET /v1/jobs` passes them."""
    return {
        "states": [params["state"]] if "state" in params else [s.value for s in JobState],
        "tenant": tenant,
        "user": params.get("user"),
        "name": params.get("name"),
        "search": params.get("q"),
    }


async def timed(client: httpx.AsyncClient, runs: int, path: str, headers=ADMIN, params=None) -> list[float]:
    times = []
    for _ in range(runs):
        begun = time.perf_counter()
        answer = await client.get(path, params=params, headers=headers)
        times.append((time.perf_counter() - begun) * 1000)
        assert answer.status_code == 200, answer.text
    return times


async def main(jobs: int, runs: int, running_jobs: int) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuyard-dashboard-") as folder:
        data = Path(folder)
        store = await open_store(f"sqlite:///{data / 'events.db'}", durable_commits=False)
        logs = await open_log_store(f"sqlite:///{data / 'logs.db'}")
        tokens_file = data / "tokens.json"
        tokens_file.write_text('{"tokens": {}}')
        ctx = SubmitContext(
            store=store,
            ledger=JobLedger(store, None, "/bench"),
            tokens=Tokens(tokens_file, "tok-admin=ops:root:admin,tok-vision=vision:ana"),
            logs=logs,
            quotas={t: 8.0 for t in TENANTS},
        )
        filling = time.perf_counter()
        await fill(store, jobs, running_jobs)
        filled = time.perf_counter() - filling
        transport = httpx.ASGITransport(app=create_app(ctx))
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
            first = (await client.get("/v1/jobs", params={"limit": 50}, headers=ADMIN)).json()
            assert len(first["items"]) == 50 and first["total"] == jobs, first["total"]
            cursor = first["next_cursor"]
            for _ in range(9):  # the 11th page: its cursor from the 10th
                cursor = (
                    await client.get("/v1/jobs", params={"limit": 50, "cursor": cursor}, headers=ADMIN)
                ).json()["next_cursor"]
            cases = [
                ("first page", "/v1/jobs", ADMIN, {"limit": 50}),
                ("11th page (?cursor=)", "/v1/jobs", ADMIN, {"limit": 50, "cursor": cursor}),
                ("?state=running", "/v1/jobs", ADMIN, {"limit": 50, "state": "running"}),
                (
                    "?state=queued&order=oldest",
                    "/v1/jobs",
                    ADMIN,
                    {"limit": 50, "state": "queued", "order": "oldest"},
                ),
                ("?q=train-42 (a name)", "/v1/jobs", ADMIN, {"limit": 50, "q": "train-42"}),
                (
                    "?q=nothing-matches (every row read)",
                    "/v1/jobs",
                    ADMIN,
                    {"limit": 50, "q": "nothing-matches"},
                ),
                (
                    "?user=ana&order=oldest",
                    "/v1/jobs",
                    ADMIN,
                    {"limit": 50, "user": "ana", "order": "oldest"},
                ),
                ("a tenant's own first page", "/v1/jobs", VISION, {"limit": 50}),
                (f"GET /v1/tenants ({running_jobs} running)", "/v1/tenants", ADMIN, None),
            ]
            rows = []
            for label, path, headers, params in cases:
                await timed(client, 2, path, headers, params)  # (warm: the first reads fill SQLite's cache)
                times = await timed(client, runs, path, headers, params)
                rows.append((label, min(times), statistics.median(times), max(times)))
            totals = {
                label: (await client.get(path, params=params, headers=headers)).json().get("total")
                for label, path, headers, params in cases[:-1]
            }
        counts = []  # what `total` costs: the store's COUNT with the filters of each listing
        for _label, _, headers, params in cases[:-1]:
            filters = store_filters(params, "vision" if headers is VISION else None)
            await store.count_projections(**filters)
            times = []
            for _ in range(runs):
                begun = time.perf_counter()
                await store.count_projections(**filters)
                times.append((time.perf_counter() - begun) * 1000)
            counts.append(statistics.median(times))
        await store.close()
        await logs.close()
    print(f"{jobs} jobs filled in {filled:.1f} s; {runs} runs each; load average {os.getloadavg()[0]:.1f}\n")
    print("| GET /v1/jobs?limit=50 … | total | min ms | median ms | max ms | of which the COUNT, median ms |")
    print("|---|---|---|---|---|---|")
    for (label, low, mid, high), count in zip(rows, [*counts, None], strict=True):
        counted = f"{count:.2f}" if count is not None else ""
        print(f"| {label} | {totals.get(label, '')} | {low:.1f} | {mid:.1f} | {high:.1f} | {counted} |")
    print("\n" + json.dumps({label: round(mid, 2) for label, _, mid, _ in rows}))


async def append_cost(jobs: int = 1500, rounds: int = 3) -> float:
    """CPU µs per ledger append over the life of `jobs` jobs, the best of `rounds` fresh stores."""
    spec = JobSpec(command="true", resources={"gpus": 1})
    best = float("inf")
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="gpuyard-appends-") as folder:
            store = await open_store(f"sqlite:///{folder}/events.db", durable_commits=False)
            ledger = JobLedger(store, None, "/bench")
            begun = time.process_time()
            for n in range(jobs):
                job_id = f"job-{n:06d}"
                placement = ReplicaPlacement(replica=0, node="n1", gpus=[GpuShare(index=0)])
                for data in (
                    JobSubmitted(job_id=job_id, name=f"train-{n % 97}", tenant="t", user="u", spec=spec),
                    JobPlaced(job_id=job_id, attempt=1, placements=[placement]),
                    JobStarted(job_id=job_id, attempt=1, node="n1", replicas=[0]),
                    JobSucceeded(job_id=job_id, attempt=1),
                ):
                    await ledger.append(job_id, data)
            best = min(best, (time.process_time() - begun) / (4 * jobs) * 1e6)
            await store.close()
    return best


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--running", type=int, default=1000, help="jobs still running (the newest)")
    parser.add_argument("--appends-only", action="store_true", help="only the CPU cost of a ledger append")
    args = parser.parse_args()
    if args.appends_only:
        cost = asyncio.run(append_cost())
        print(f"{cost:.1f} µs of CPU per ledger append; load average {os.getloadavg()[0]:.1f}")
    else:
        asyncio.run(main(args.jobs, args.runs, args.running))
