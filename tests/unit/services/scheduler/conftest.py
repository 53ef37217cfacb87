import pytest

from gpuyard.shared.stores.events import open_store


@pytest.fixture
async def store(tmp_path):
    """An event store of the test's own (SQLite)."""
    s = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    yield s
    await s.close()
