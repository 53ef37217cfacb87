"""Fixtures shared by the executor's unit tests."""

from __future__ import annotations

import pytest

from .harness import Harness


@pytest.fixture
async def h(tmp_path):
    """A store, a ledger and a fake bus in `tmp_path`, to drive executors with (see `Harness`)."""
    harness = await Harness(tmp_path).open()
    yield harness
    await harness.close()
