"""Two kinds of job measured against each other, one at a time (`volume_start.py`: with a volume and without;
`environments.py`: with a cached environment and without): each job submitted once the one before it ended,
then per kind min / median / max of its start, and the difference of the medians."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

from gpuyard.client import Client

# imported as benchmarks.pairs (python -m, a test), or beside a script run from its folder
if __package__:
    from benchmarks.pipeline import Submitter, Tap
    from benchmarks.storage import summary
else:
    from pipeline import Submitter, Tap
    from storage import summary

JOB_TIMEOUT_S = 300.0
METRICS = ("placed_to_running_ms", "submit_to_running_ms")


async def one_at_a_time(
    client: Client, nats_url: str, credentials: Path, order: list[tuple[str, dict]], tap: Tap | None = None
) -> tuple[list[tuple[str, str]], Tap]:
    """Each job of `order` ((kind, spec)) submitted once the one before it ended: [(kind, job id)], and the tap
    (a `Tap` by default) that saw their events."""
    tap = await (tap or Tap()).open(nats_url, credentials)
    submitter = Submitter(client.server, client.token)
    done: list[tuple[str, str]] = []
    try:
        for kind, spec in order:
            job_id = (await submitter.submit(json.dumps(spec).encode()))["job_id"]
            deadline = time.monotonic() + JOB_TIMEOUT_S
            while job_id not in tap.ended:
                if time.monotonic() > deadline:
                    raise SystemExit(f"job {job_id} ({kind}) did not end within {JOB_TIMEOUT_S:.0f} s")
                await asyncio.sleep(0.01)
            done.append((kind, job_id))
    finally:
        submitter.close()
        await tap.close()
    return done, tap


def paired_figures(
    times: dict[str, dict[str, float]], jobs: list[tuple[str, str]], kinds: tuple[str, str]
) -> dict:
    """Per kind (`kinds`: the one with, the one without): jobs, failed, and min / median / max of each metric
    (ms) over the jobs that started; and the median with minus the median without."""
    out: dict = {}
    for kind in kinds:
        seen = [times.get(job_id, {}) for k, job_id in jobs if k == kind]
        started = [t for t in seen if "started" in t]
        values = {
            "placed_to_running_ms": [(t["started"] - t["placed"]) * 1e3 for t in started],
            "submit_to_running_ms": [(t["started"] - t["submitted"]) * 1e3 for t in started],
        }
        out[kind] = {
            "jobs": len(seen),
            "failed": sum("failed" in t for t in seen),
            **{metric: summary(v) if v else None for metric, v in values.items()},
        }
    with_, without = kinds
    out["with_minus_without_median_ms"] = {
        metric: round(out[with_][metric]["median"] - out[without][metric]["median"], 3)
        if out[with_][metric] and out[without][metric]
        else None
        for metric in METRICS
    }
    return out
