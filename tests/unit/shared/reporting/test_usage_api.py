"""GPU-hours accounting (gpuyard.shared.reporting.usage) for jobs whose run is known, and the routes of history and usage
(`/v1/usage`, `/v1/gpus/history`, `/v1/jobs/{id}/gpu`) with their tenant filters, and their answer while the
history cannot be reached. (Each history backend's own behaviour: tests/contract/test_gpu_history.py.)"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    GpuShare,
    JobPlaced,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import fold
from gpuyard.shared.reporting.usage import allocated_seconds, group, job_usages
from gpuyard.shared.stores.events import StoreUnavailable
from gpuyard.shared.stores.gpuhistory.base import GpuPoint, open_gpu_history
from gpuyard.shared.stores.ledger import projection_of
from tests.unit.services.submit.test_submit_api import ADMIN, NLP, VISION, api, ctx  # noqa: F401 (fixtures)

HOUR = 3600.0


def job_events(
    job_id: str, tenant: str, user: str, gpus: float, runs: list[tuple[datetime, datetime | None]]
):
    """A job with one attempt per run (placed at its start, ended at its end: requeued, the last succeeded)."""
    spec = JobSpec(name="train", command="python train.py", resources={"gpus": gpus})
    t0 = runs[0][0] - timedelta(minutes=1)
    at = iter(range(1000))

    def ev(data, when):
        return make_event(data, source="/test", id=f"{job_id}-{next(at)}", time=when)

    events = [ev(JobSubmitted(job_id=job_id, name="train", tenant=tenant, user=user, spec=spec), t0)]
    share = GpuShare(index=0, fraction=min(gpus, 1.0))
    for attempt, (start, end) in enumerate(runs, start=1):
        placement = [ReplicaPlacement(replica=0, node="n1", gpus=[share])]
        events.append(ev(JobPlaced(job_id=job_id, attempt=attempt, placements=placement), start))
        events.append(ev(JobStarted(job_id=job_id, attempt=attempt, node="n1", replicas=[0]), start))
        if end is None:
            continue
        if attempt < len(runs):
            data = JobRequeued(
                job_id=job_id, attempt=attempt + 1, reason=RequeueReason.NODE_LOST, message="x"
            )
        else:
            data = JobSucceeded(job_id=job_id, attempt=attempt)
        events.append(ev(data, end))
    return events


def samples(job_id: str, tenant: str, fraction: float, start: float, seconds: int, util: float):
    """One sample a second of the job's GPU, at `util` percent."""
    holder = GpuHolder(job_id=job_id, tenant=tenant, user="u", fraction=fraction)
    reading = GpuReading(
        index=0, uuid="GPU-0", utilization_pct=util, memory_used_bytes=1 << 30, holders=[holder]
    )
    return [GpuPoint.raw("n1", reading, start + s, 1.0) for s in range(seconds)]


def test_half_a_gpu_for_two_hours_at_half_utilization_is_one_gpu_hour_allocated_and_half_used():
    start = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
    end = start + timedelta(hours=2)
    view = fold(job_events("j1", "vision", "ana", 0.5, [(start, end)]))
    fraction, hours, util = 0.5, 2.0, 50.0
    points = samples("j1", "vision", fraction, start.timestamp(), int(hours * HOUR), util)
    [usage] = job_usages([view], points, start.timestamp() - HOUR, end.timestamp() + HOUR)
    assert usage.allocated / HOUR == pytest.approx(fraction * hours)  # 1.0 GPU-h
    assert usage.used / HOUR == pytest.approx(fraction * hours * util / 100)  # 0.5 GPU-h
    assert usage.mean_utilization_pct == pytest.approx(util)
    [row] = group([usage], "tenant")
    assert row.waste_gpu_hours == pytest.approx(fraction * hours * (1 - util / 100))


def test_allocation_counts_each_attempt_and_is_clipped_to_the_window():
    t = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
    runs = [(t, t + timedelta(hours=1)), (t + timedelta(hours=2), t + timedelta(hours=5))]
    view = fold(job_events("j2", "vision", "ana", 2, runs))  # 2 whole GPUs
    ts = t.timestamp()
    assert allocated_seconds(view, ts - HOUR, ts + 10 * HOUR) == pytest.approx(2 * (1 + 3) * HOUR)
    assert allocated_seconds(view, ts + 0.5 * HOUR, ts + 3 * HOUR) == pytest.approx(2 * (0.5 + 1) * HOUR)
    running = fold(job_events("j3", "vision", "ana", 1, [(t, None)]))  # still running: up to the window's end
    assert allocated_seconds(running, ts, ts + 4 * HOUR) == pytest.approx(4 * HOUR)


def test_usage_groups_by_tenant_user_and_job():
    t = datetime(2026, 11, 20, 8, 0, tzinfo=UTC)
    one_hour = [(t, t + timedelta(hours=1))]
    views = [
        fold(job_events("a1", "vision", "ana", 1, one_hour)),
        fold(job_events("a2", "vision", "ana", 1, one_hour)),
        fold(job_events("b1", "vision", "bo", 1, one_hour)),
        fold(job_events("c1", "nlp", "cy", 1, one_hour)),
    ]
    usages = job_usages(views, [], t.timestamp(), t.timestamp() + 2 * HOUR)
    by_tenant = {r.tenant: (r.jobs, r.allocated_gpu_hours) for r in group(usages, "tenant")}
    assert by_tenant == {"nlp": (1, pytest.approx(1.0)), "vision": (3, pytest.approx(3.0))}
    by_user = {(r.tenant, r.user): r.jobs for r in group(usages, "user")}
    assert by_user == {("nlp", "cy"): 1, ("vision", "ana"): 2, ("vision", "bo"): 1}
    by_job = [(r.tenant, r.user, r.job_id) for r in group(usages, "job")]  # by tenant, user, job
    assert by_job == [
        ("nlp", "cy", "c1"),
        ("vision", "ana", "a1"),
        ("vision", "ana", "a2"),
        ("vision", "bo", "b1"),
    ]
    with pytest.raises(ValueError):
        group(usages, "node")


def store_job(ctx, events) -> None:  # noqa: F811
    view = fold(events)
    asyncio.run(ctx.store.append(view.job_id, 0, events, projection_of(view)))


def add_points(ctx, points) -> None:  # noqa: F811
    async def go():
        history = await open_gpu_history(ctx.store)  # (as the routes open it)
        await history.add(points)
        await history.close()

    asyncio.run(go())


@pytest.fixture
def two_tenants_ran(ctx):  # noqa: F811
    """vision's job held a whole GPU for the last 30 minutes at 80 %; nlp's half a GPU at 20 % (both done)."""
    end = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    start = end - timedelta(minutes=30)
    store_job(ctx, job_events("job-vis", "vision", "ana", 1, [(start, end)]))
    store_job(ctx, job_events("job-nlp", "nlp", "bo", 0.5, [(start, end)]))
    seconds = int((end - start).total_seconds())
    add_points(ctx, samples("job-vis", "vision", 1.0, start.timestamp(), seconds, 80.0))
    nlp = samples("job-nlp", "nlp", 0.5, start.timestamp(), seconds, 20.0)
    add_points(ctx, [GpuPoint(**{**_fields(p), "gpu": 1}) for p in nlp])
    return seconds / HOUR


def _fields(p: GpuPoint) -> dict:
    return {f: getattr(p, f) for f in GpuPoint.__slots__}


def rows(answer) -> dict:
    assert answer.status_code == 200, answer.text
    return {(r["tenant"], r["user"], r["job_id"]): r for r in answer.json()["rows"]}


def test_a_tenant_sees_its_own_usage_and_an_admin_all(api, ctx, two_tenants_ran):  # noqa: F811
    hours = two_tenants_ran
    mine = rows(api.get("/v1/usage", params={"since": "2h"}, headers=VISION))
    assert list(mine) == [("vision", None, None)]
    [vision] = mine.values()
    assert vision["allocated_gpu_hours"] == pytest.approx(hours, rel=1e-3)
    assert vision["used_gpu_hours"] == pytest.approx(hours * 0.8, rel=1e-3)
    assert vision["waste_gpu_hours"] == pytest.approx(hours * 0.2, rel=1e-3)
    everyone = rows(api.get("/v1/usage", params={"since": "2h", "by": "job"}, headers=ADMIN))
    assert set(everyone) == {("vision", "ana", "job-vis"), ("nlp", "bo", "job-nlp")}
    nlp = everyone["nlp", "bo", "job-nlp"]
    assert nlp["allocated_gpu_hours"] == pytest.approx(hours * 0.5, rel=1e-3)
    assert nlp["used_gpu_hours"] == pytest.approx(hours * 0.5 * 0.2, rel=1e-3)
    only_nlp = rows(api.get("/v1/usage", params={"tenant": "nlp", "by": "user"}, headers=ADMIN))
    assert list(only_nlp) == [("nlp", "bo", None)]
    assert api.get("/v1/usage", params={"tenant": "nlp"}, headers=VISION).status_code == 403
    assert "job-nlp" not in api.get("/v1/usage", params={"by": "job"}, headers=VISION).text
    for bad in ("soon", "0", "0h0m", "-1h", "1h30"):  # (the query's pattern: more than no time)
        refused = api.get("/v1/usage", params={"since": bad}, headers=VISION)
        assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "since"], bad
    longest = api.get("/v1/usage", params={"since": "500d"}, headers=VISION).json()  # the last 400 days
    window = datetime.fromisoformat(longest["until"]) - datetime.fromisoformat(longest["since"])
    assert abs(window - timedelta(days=400)) < timedelta(seconds=1)
    assert api.get("/v1/usage", params={"by": "node"}, headers=VISION).status_code == 422


def test_a_nodes_history_shows_another_tenants_holder_only_as_other(api, ctx, two_tenants_ran):  # noqa: F811
    answer = api.get("/v1/gpus/history", params={"node": "n1", "since": "1h", "step": 60}, headers=VISION)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["step_seconds"] == 60 and {p["gpu"] for p in body["points"]} == {0, 1}
    holders = [h for p in body["points"] for h in p["holders"]]
    assert {h["job_id"] for h in holders} == {"job-vis", None}
    assert all(h["other"] and h["tenant"] is None for h in holders if h["job_id"] is None)
    assert "job-nlp" not in answer.text and "nlp" not in answer.text
    admin = api.get("/v1/gpus/history", params={"node": "n1", "since": "1h"}, headers=ADMIN).json()
    assert {h["job_id"] for p in admin["points"] for h in p["holders"]} == {"job-vis", "job-nlp"}
    assert len(admin["points"]) <= 2 * 601  # about 600 points per GPU at most
    assert api.get("/v1/gpus/history", params={"node": "n 1"}, headers=VISION).status_code == 422
    too_fine = api.get("/v1/gpus/history", params={"node": "n1", "since": "7d", "step": 1}, headers=VISION)
    assert too_fine.status_code == 200 and too_fine.json()["step_seconds"] == 61  # 604800 s / 10,000 points
    empty = api.get("/v1/gpus/history", params={"node": "n9"}, headers=VISION).json()
    assert empty["points"] == []


def test_a_jobs_gpu_over_its_run_for_its_tenant_only(api, ctx, two_tenants_ran):  # noqa: F811
    hours = two_tenants_ran
    answer = api.get("/v1/jobs/job-vis/gpu", headers=VISION)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["mean_utilization_pct"] == pytest.approx(80.0)
    assert body["allocated_gpu_hours"] == pytest.approx(hours, rel=1e-3)
    assert body["used_gpu_hours"] == pytest.approx(hours * 0.8, rel=1e-3)
    assert body["peak_memory_used_bytes"] == 1 << 30 and body["points"]
    assert {h["job_id"] for p in body["points"] for h in p["holders"]} == {"job-vis"}
    assert api.get("/v1/jobs/job-nlp/gpu", headers=VISION).status_code == 404
    assert api.get("/v1/jobs/job-nlp/gpu", headers=NLP).json()["mean_utilization_pct"] == pytest.approx(20.0)


def test_a_job_with_no_samples_has_no_mean_utilization(api, ctx):  # noqa: F811
    start = datetime.now(UTC) - timedelta(minutes=10)
    store_job(ctx, job_events("job-quiet", "vision", "ana", 1, [(start, start + timedelta(minutes=5))]))
    body = api.get("/v1/jobs/job-quiet/gpu", headers=VISION).json()
    assert body["mean_utilization_pct"] is None and body["used_gpu_hours"] == 0 and body["points"] == []
    assert body["allocated_gpu_hours"] == pytest.approx(5 / 60, rel=1e-3)


def test_the_routes_answer_503_only_while_the_history_cannot_be_reached(api, ctx, monkeypatch):  # noqa: F811
    async def away(store):
        raise StoreUnavailable("the GPU history: MongoDB reading failed: no primary")

    monkeypatch.setattr("gpuyard.services.submit.routes_usage.open_gpu_history", away)
    monkeypatch.delattr(api.app.state, "gpu_history", raising=False)
    for path in ("/v1/usage", "/v1/gpus/history?node=n1"):
        answer = api.get(path, headers=ADMIN)
        assert answer.status_code == 503 and "no primary" in answer.text, path
        assert answer.headers["Retry-After"]
    monkeypatch.undo()
    assert api.get("/v1/gpus/history?node=n1", headers=ADMIN).status_code == 200  # reached again
