"""The handler table: each event goes to the handler of its model, with its typed data and its envelope."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobCancelRequested, JobPlaced, JobPreempted, JobSucceeded
from gpuyard.shared.contracts.events.nodes import NodeLost
from gpuyard.shared.runtime.handlers import HandlerTable


def test_each_event_reaches_the_handler_of_its_model_with_its_data_and_envelope():
    seen = []

    async def on_stop(data, event):
        seen.append(("stop", data, event.id))

    async def on_lost(data, event):
        seen.append(("lost", data, event.id))

    table = HandlerTable({(JobCancelRequested, JobPreempted): on_stop, NodeLost: on_lost})
    cancel = make_event(JobCancelRequested(job_id="j1", by="ana"), source="test")
    lost = make_event(NodeLost(node="n1", last_seen=datetime(2026, 11, 1, tzinfo=UTC)), source="test")
    ended = make_event(JobSucceeded(job_id="j1", attempt=1), source="test")
    for event in (cancel, lost, ended):
        asyncio.run(table(event, object()))  # (the bus's message stays with the table)
    assert seen == [("stop", cancel.data, cancel.id), ("lost", lost.data, lost.id)]
    assert JobSucceeded not in table.handlers  # (its event reached no handler above)


def test_the_table_names_its_subjects_as_consumer_filters():
    async def handle(data, event):
        return None

    table = HandlerTable({NodeLost: handle, JobPlaced: handle, JobCancelRequested: handle})
    assert table.subject_filters() == ["job.placed.*", "job.cancel_requested.*", "node.lost"]


def test_two_handlers_for_one_model_are_refused():
    async def handle(data, event):
        return None

    with pytest.raises(ValueError, match="two handlers for JobPlaced"):
        HandlerTable({JobPlaced: handle, (JobPlaced, NodeLost): handle})
