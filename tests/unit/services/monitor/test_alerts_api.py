"""Alerts recorded in the event store (gpuyard.shared.stores.readmodels.alertbook), once each, and `GET /v1/alerts`: a tenant sees the
alerts about its own jobs, an admin sees all."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from gpuyard.shared.contracts.events.alerts import AlertRaised, AlertResolved
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.stores.readmodels.alertbook import AlertBook, active_alerts
from tests.unit.services.submit.test_submit_api import ADMIN, NLP, VISION, api, ctx  # noqa: F401 (fixtures)

T0 = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)


def raise_event(alert_id: str, kind: str, minutes: int, tenant: str | None = None, **fields):
    data = AlertRaised(alert_id=alert_id, kind=kind, message=f"{kind} happened", tenant=tenant, **fields)
    return make_event(
        data, source="/test", id=f"r-{alert_id}-{minutes}", time=T0 + timedelta(minutes=minutes)
    )


def resolve_event(alert_id: str, kind: str, minutes: int, tenant: str | None = None):
    data = AlertResolved(alert_id=alert_id, kind=kind, message="cleared", tenant=tenant)
    return make_event(
        data, source="/test", id=f"x-{alert_id}-{minutes}", time=T0 + timedelta(minutes=minutes)
    )


def record_some(store) -> None:
    async def go():
        book = AlertBook(store)
        await book.load()
        await book.record(raise_event("gpu_temperature/node-1/0", "gpu_temperature", 0, node="node-1"))
        await book.record(raise_event("gpu_idle/node-1/1/j-nlp", "gpu_idle", 1, "nlp", job_id="j-nlp"))
        await book.record(raise_event("job_waiting/j-vis", "job_waiting", 2, "vision", job_id="j-vis"))
        await book.record(resolve_event("job_waiting/j-vis", "job_waiting", 3, "vision"))
        await book.record(raise_event("job_waiting/j-vis", "job_waiting", 4, "vision", job_id="j-vis"))

    asyncio.run(go())


def test_an_alert_is_recorded_once_and_its_resolve_ends_the_occurrence_it_names(ctx):  # noqa: F811
    async def go():
        book = AlertBook(ctx.store)
        raised = raise_event("gpu_ecc/node-1/0", "gpu_ecc", 0, node="node-1", gpu_index=0)
        assert await book.record(raised) is True
        assert await book.record(raised) is False  # redelivered: nothing new
        restarted = AlertBook(ctx.store)
        [active] = await restarted.load()
        assert active.raised == raised.data and active.raised_id == raised.id
        resolved = resolve_event("gpu_ecc/node-1/0", "gpu_ecc", 5)
        assert await restarted.record(resolved, raised_id=raised.id) is True
        assert await book.record(resolved) is False  # the other process's index is behind: the store says no
        assert await restarted.record(resolved) is False and await active_alerts(ctx.store) == []
        assert [s.event.id for s in await ctx.store.read_stream(active.stream)] == [raised.id, resolved.id]

    asyncio.run(go())


def test_a_resolve_with_no_raise_recorded_changes_nothing(ctx):  # noqa: F811
    async def go():
        book = AlertBook(ctx.store)
        assert await book.record(resolve_event("gpu_lost/n/0", "gpu_lost", 0)) is False
        assert await active_alerts(ctx.store) == []

    asyncio.run(go())


def ids(answer) -> list[str]:
    assert answer.status_code == 200, answer.text
    return [(a["alert_id"], a["state"]) for a in answer.json()["items"]]


def test_a_tenant_sees_only_the_alerts_about_its_jobs_and_an_admin_all(api, ctx):  # noqa: F811
    record_some(ctx.store)
    assert ids(api.get("/v1/alerts", headers=VISION)) == [
        ("job_waiting/j-vis", "active"),
        ("job_waiting/j-vis", "resolved"),
    ]
    assert ids(api.get("/v1/alerts", headers=NLP)) == [("gpu_idle/node-1/1/j-nlp", "active")]
    assert len(ids(api.get("/v1/alerts", headers=ADMIN))) == 4  # the GPU's alert too (no tenant's)
    assert api.get("/v1/alerts", params={"tenant": "nlp"}, headers=VISION).status_code == 403
    assert ids(api.get("/v1/alerts", params={"tenant": "nlp"}, headers=ADMIN)) == [
        ("gpu_idle/node-1/1/j-nlp", "active")
    ]
    assert "j-nlp" not in api.get("/v1/alerts", headers=VISION).text
    assert api.get("/v1/alerts").status_code == 401


def test_alerts_filter_by_state_and_kind_and_page_newest_first(api, ctx):  # noqa: F811
    record_some(ctx.store)
    active = api.get("/v1/alerts", params={"state": "active"}, headers=ADMIN).json()["items"]
    assert [a["alert_id"] for a in active] == [
        "job_waiting/j-vis",
        "gpu_idle/node-1/1/j-nlp",
        "gpu_temperature/node-1/0",
    ]
    [gone] = api.get("/v1/alerts", params={"state": "resolved"}, headers=ADMIN).json()["items"]
    assert gone["resolved_message"] == "cleared" and gone["resolved_at"] > gone["raised_at"]
    assert ids(api.get("/v1/alerts", params={"kind": "gpu_temperature"}, headers=ADMIN)) == [
        ("gpu_temperature/node-1/0", "active")
    ]
    first = api.get("/v1/alerts", params={"limit": 2}, headers=ADMIN).json()
    assert len(first["items"]) == 2 and first["next_cursor"]
    rest = api.get("/v1/alerts", params={"limit": 2, "cursor": first["next_cursor"]}, headers=ADMIN).json()
    seen = [a["alert_id"] for a in first["items"] + rest["items"]]
    assert len(seen) == 4 and rest["next_cursor"] is None
    by_kind = api.get("/v1/alerts", params={"limit": 1, "kind": "job_waiting"}, headers=ADMIN).json()
    more = api.get(
        "/v1/alerts",
        params={"limit": 1, "kind": "job_waiting", "cursor": by_kind["next_cursor"]},
        headers=ADMIN,
    ).json()
    assert [a["state"] for a in by_kind["items"] + more["items"]] == ["active", "resolved"]
    assert api.get("/v1/alerts", params={"cursor": "non sense"}, headers=ADMIN).status_code == 422
    assert api.get("/v1/alerts", params={"state": "open"}, headers=ADMIN).status_code == 422
    assert api.get("/v1/alerts", params={"kind": "GPU IDLE"}, headers=ADMIN).status_code == 422


def test_the_job_listing_never_shows_an_alert(api, ctx):  # noqa: F811
    record_some(ctx.store)
    answer = api.get("/v1/jobs", params={"tenant": "vision"}, headers=ADMIN)
    assert answer.status_code == 200 and answer.json()["items"] == []


def test_no_job_id_nor_prefix_of_one_names_an_alert(api, ctx):  # noqa: F811
    record_some(ctx.store)
    for who in (ADMIN, NLP, VISION):
        for prefix in ("alert", "/alerts", "gpu_idle"):
            answer = api.get(f"/v1/jobs/{prefix}", headers=who)
            assert answer.status_code == 404, (prefix, answer.status_code, answer.text)
