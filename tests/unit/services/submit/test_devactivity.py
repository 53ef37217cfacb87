"""A dev environment's activity as the proxy notes it (`gpuyard.services.submit.devactivity`): what counts, and at
most one `dev.activity` per environment every minute (or a quarter of a shorter idle timeout), published in the
background; a failed publish lets the next activity try again."""

from __future__ import annotations

import asyncio

from gpuyard.services.submit.devactivity import (
    EVERY,
    KEPT,
    ActivityNotes,
    counts_request,
    counts_socket,
    every_for,
)
from gpuyard.shared.contracts.devspec import DevSpec
from gpuyard.shared.contracts.events.dev import DevActivity
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobState, JobView


def view(job_id="d1", attempt=1, idle_timeout: float | None = 7200.0) -> JobView:
    spec = JobSpec(dev=DevSpec(), idle_timeout=idle_timeout)
    return JobView(
        job_id=job_id, name="explore", tenant="vision", user="ana", state=JobState.RUNNING, attempt=attempt,
        spec=spec, created_at="2026-11-30T00:00:00Z", updated_at="2026-11-30T00:00:00Z",
    )  # fmt: skip


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Published(list):
    def __init__(self, fail: int = 0):
        super().__init__()
        self.fail = fail

    async def __call__(self, event) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("the bus is away")
        self.append(event)


async def sent(notes: ActivityNotes) -> None:
    """Every publish in flight done (the witness that what was noted went out, or failed)."""
    async with asyncio.timeout(5):
        await asyncio.gather(*notes.sending)


def test_what_counts_as_activity():
    assert counts_socket("api/kernels/5f0c-11/channels") and counts_socket("terminals/websocket/1")
    assert not counts_socket("api/events/subscribe") and not counts_socket("api/collaboration/room/x")
    assert not counts_socket("api/kernels/5f0c-11/channels/more")
    assert counts_request("POST") and counts_request("put") and counts_request("DELETE")
    assert not counts_request("GET") and not counts_request("HEAD") and not counts_request("OPTIONS")


def test_how_often_by_the_idle_timeout():
    assert every_for(7200) == EVERY == 60 and every_for(None) == EVERY
    assert every_for(20) == 5 and every_for(2) == 1
    assert every_for(0) is None  # never stopped for idleness: nothing to say


async def test_one_event_per_environment_per_interval_with_its_figures():
    clock, published = Clock(), Published()
    notes = ActivityNotes(published, "/gpuyard/submit/test", clock=clock)
    assert notes.note(view()) is True
    assert [notes.note(view()) for _ in range(100)] == [False] * 100  # the same minute
    assert notes.note(view("d2")) is True  # another environment: its own
    await sent(notes)
    assert len(published) == 2
    data = published[0].data
    assert isinstance(data, DevActivity) and (data.job_id, data.attempt, data.tenant) == ("d1", 1, "vision")
    assert published[0].time == data.at and published[0].type == "io.gpuyard.dev.activity"
    clock.now += EVERY - 0.5
    assert notes.note(view()) is False
    clock.now += 0.5
    assert notes.note(view()) is True  # a minute later
    assert notes.note(view(attempt=2)) is True  # a new attempt: at once
    await sent(notes)
    assert len(published) == 4
    assert [e.data.attempt for e in published[2:]] == [1, 2]


async def test_a_short_idle_timeout_is_told_more_often_and_an_environment_without_one_never():
    clock, published = Clock(), Published()
    notes = ActivityNotes(published, "/gpuyard/submit/test", clock=clock)
    assert notes.note(view(idle_timeout=20)) is True
    clock.now += 5
    assert notes.note(view(idle_timeout=20)) is True
    assert notes.note(view("off", idle_timeout=0)) is False
    await sent(notes)
    assert len(published) == 2
    assert "off" not in notes.noted


async def test_a_failed_publish_lets_the_next_activity_try_again():
    published = Published(fail=1)
    notes = ActivityNotes(published, "/gpuyard/submit/test", clock=Clock())
    assert notes.note(view()) is True
    await sent(notes)
    assert published == [] and "d1" not in notes.noted  # (the failed one is forgotten)
    assert notes.note(view()) is True
    await sent(notes)
    assert len(published) == 1


def test_without_a_bus_nothing_is_noted():
    notes = ActivityNotes(None, "/gpuyard/submit/test")
    assert notes.note(view()) is False and notes.noted == {}


async def test_environments_not_heard_from_are_forgotten_when_many():
    clock, published = Clock(), Published()
    notes = ActivityNotes(published, "/gpuyard/submit/test", clock=clock)
    for i in range(KEPT):
        notes.note(view(f"old{i}"))
    clock.now += EVERY
    notes.note(view("new"))
    assert list(notes.noted) == ["new"]
    await sent(notes)
    assert len(published) == KEPT + 1
