"""What every answer of the API shares: the base of the public models, page cursors, errors, health."""

from __future__ import annotations

import base64
from typing import TypeVar

from pydantic import BaseModel, ConfigDict, Field


class Out(BaseModel):
    """Base of every answer. Readers ignore fields they do not know, so a newer server does not break an
    older CLI."""

    model_config = ConfigDict(extra="ignore", frozen=True)


PublicModel = TypeVar("PublicModel", bound=Out)


CURSOR_PATTERN = r"^([A-Za-z0-9_-]{4})*([A-Za-z0-9_-]{2,3})?$"
"""A page cursor (`?cursor=`): base64url, unpadded. Every such text is a place in a listing, where its next page
starts: the cursor a page answers, or any other (a cursor not made by a page is a place all the same)."""


CURSOR_MAX = 1000


def page_cursor(created_at: str, item_id: str) -> str:
    """The cursor of the place after the item created at `created_at` with id `item_id` (in either order)."""
    return base64.urlsafe_b64encode(f"{created_at}\n{item_id}".encode()).decode().rstrip("=")


def page_place(cursor: str) -> tuple[str, str]:
    """(created_at, item id) of a cursor matching CURSOR_PATTERN (bytes that are not UTF-8 read as U+FFFD)."""
    text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode("utf-8", "replace")
    created_at, _, item_id = text.replace("\x00", "\ufffd").partition("\n")
    return created_at, item_id


class ErrorOut(Out):
    """Every refusal but a request's validation (422, one reason per field) is this."""

    detail: str = Field(description="Why, for people.")


class HealthOut(Out):
    status: str
    service: str


def _public(model: type[PublicModel], internal: BaseModel) -> PublicModel:
    """The public form of an internal model: its fields of the same names, nothing else (the rest stays the
    platform's business)."""
    return model.model_validate(internal, from_attributes=True)
