"""The log shipper on a full disk: a log store that cannot write (its disk full) is said once, not at every try
(twice a second), the output kept meanwhile; once it writes again, that is said once, and nothing was lost."""

from __future__ import annotations

import asyncio
import logging
import time

from gpuyard.shared.stores.events import StoreFull
from gpuyard.shared.stores.logs import LogKey
from gpuyard.shared.stores.logs.base import Chunk
from gpuyard.shared.stores.logs.shipper import LogShipper


class FullStore:
    """A log store whose disk is full for its first `refusals` appends."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.chunks: list[Chunk] = []

    async def append(self, chunks: list[Chunk]) -> None:
        if self.refusals:
            self.refusals -= 1
            raise StoreFull("the log store cannot write: its disk is full (database or disk is full)")
        self.chunks += chunks

    async def trim(self, key, before) -> None:
        return None


async def test_a_full_log_store_is_said_once_and_its_output_kept_until_it_writes_again(caplog):
    caplog.set_level(logging.WARNING, logger="gpuyard.shared.stores.logs.shipper")
    store = FullStore(refusals=5)
    shipper = LogShipper(store, interval=0.01)  # type: ignore[arg-type]
    key = LogKey("job", 1, 0)
    shipper.open(key)
    shipper.write(key, b"line 1\n")
    shipper.start()
    deadline = time.monotonic() + 60
    while not any(r.getMessage() == "logs are shipped to the log store again" for r in caplog.records):
        assert time.monotonic() < deadline, "the shipper never wrote again"
        await asyncio.sleep(0.01)
    shipper.write(key, b"line 2\n")
    shipper.close(key)
    await shipper.stop()
    said = [r.getMessage() for r in caplog.records]
    assert (
        len(said) == 2
        and "cannot ship logs" in said[0]
        and said[1] == "logs are shipped to the log store again"
    )
    assert b"".join(c.data for c in store.chunks) == b"line 1\nline 2\n"
