"""httpx's async client (serving's proxy to its model servers, the monitor's webhooks) on httpcore: what it costs
per request."""

from __future__ import annotations

import asyncio
import sys

from httpcore._synchronization import current_async_library


def test_httpcore_finds_its_event_loop_without_a_failed_import_per_ask():
    """httpcore asks which event loop runs at every lock and event a request makes, by importing sniffio: where
    sniffio is missing, each ask is a failed import (a search of the whole path, ~50 µs), several per request.
    The platform's dependencies include it, so the ask is a dictionary lookup."""

    async def ask() -> str:
        return current_async_library()

    assert asyncio.run(ask()) == "asyncio"
    assert "sniffio" in sys.modules
