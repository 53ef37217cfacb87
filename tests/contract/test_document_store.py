"""The contract of the documents (`DocumentStore`), for every event store adapter (`eventstores.py`)."""

from __future__ import annotations

import pytest

from tests.contract.conftest import EVENT_STORE_BACKENDS
from tests.contract.eventstores import event_store


@pytest.fixture(params=EVENT_STORE_BACKENDS)
async def store(request, tmp_path):
    async with event_store(request, tmp_path) as s:
        yield s


async def test_a_document_is_replaced_whole(store):
    assert await store.get_document("queue-line") is None
    await store.put_document("queue-line", {"at": "t1", "jobs": ["a", "b"]})
    await store.put_document("other", {"n": 1})
    await store.put_document("queue-line", {"at": "t2", "jobs": ["b"]})
    assert await store.get_document("queue-line") == {"at": "t2", "jobs": ["b"]}
    assert await store.get_document("other") == {"n": 1}
