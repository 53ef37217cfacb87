"""The API's page cursors (`?cursor=`, `next_cursor`) and the event store's: one listing's page after another."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from gpuyard.shared.contracts.api.common import CURSOR_MAX, CURSOR_PATTERN, page_cursor, page_place
from gpuyard.shared.stores.events.base import Order, decode_cursor, encode_cursor

Cursor = Annotated[
    str | None,
    Query(
        pattern=CURSOR_PATTERN,
        max_length=CURSOR_MAX,
        description="Where the page starts: the `next_cursor` of the page before (a place in the listing, "
        "after that page's last item in the order asked).",
    ),
]


def store_cursor(cursor: str | None, order: Order = "newest") -> str | None:
    """The event store's cursor of an API's page cursor (None: the first page)."""
    return encode_cursor(*page_place(cursor), order) if cursor else None


def api_cursor(cursor: str | None, order: Order = "newest") -> str | None:
    """The API's page cursor of the event store's (None: no page after)."""
    return page_cursor(*decode_cursor(cursor, order)) if cursor else None
