"""Tenants and their tokens as the API shows them."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any

from pydantic import AwareDatetime, BeforeValidator, ConfigDict, Field, StrictBool, model_validator
from pydantic.config import JsonValue
from pydantic_core import PydanticCustomError

from gpuyard.shared.contracts.api.common import Out
from gpuyard.shared.contracts.fieldtypes import Name, Seconds, Strict, Text


class TenantOut(Out):
    tenant: str
    guaranteed_gpus: float = Field(
        description="Its quota: the GPUs it is guaranteed (GPUYARD_QUOTAS); 0: none."
    )
    used_gpus: float = Field(description="GPUs its placed and running jobs hold (a share as its fraction).")
    borrowed_gpus: float = Field(
        description="Of those, the GPUs of its jobs placed on another tenant's idle quota: the first to go."
    )
    queued: int = Field(description="Its jobs waiting to be placed.")
    placed: int = Field(description="Its jobs placed, not yet running.")
    running: int = Field(description="Its jobs running.")
    oldest_queued_seconds: float | None = Field(
        description="How long its oldest queued job has waited since it was submitted; null: none queued."
    )


class TenantListOut(Out):
    items: list[TenantOut] = Field(description="By tenant name.")


MAX_TOKEN_SECONDS = 100 * 365 * 86400.0
"""The longest a created token lives (`expires_in`): a longer one expires after this, well before the last date
a date can hold (year 9999)."""


RFC3339 = r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})"


def _rfc3339(value: Any) -> Any:
    """A time of a request's body as the schema's `date-time` says it: RFC 3339 text, with its offset (not a
    number of seconds, which pydantic would also read)."""
    if not isinstance(value, str) or not re.fullmatch(RFC3339, value):
        raise PydanticCustomError(
            "datetime_type", "a date and time with its timezone, such as 2030-01-01T00:00:00Z"
        )
    return value


Rfc3339 = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


def _null_or_absent(field: str) -> list[JsonValue]:
    """JSON Schema for: `field` is absent, or null."""
    return [{"not": {"required": [field]}}, {"properties": {field: {"type": "null"}}}]


class TokenIn(Strict):
    """A token to create (admin only): whom it stands for and, optionally, when it expires."""

    model_config = ConfigDict(  # `_one_expiry`'s rule in the schema: not both
        json_schema_extra={
            "dependentSchemas": {
                "expires_in": {"anyOf": _null_or_absent("expires_in") + _null_or_absent("expires_at")}
            }
        }
    )

    tenant: Name = Field(description="The tenant the token stands for.")
    user: Text = Field("", max_length=200, description="The user it stands for (shown on jobs).")
    admin: StrictBool = Field(False, description="An admin token sees every tenant and manages tokens.")
    expires_in: Seconds | None = Field(
        None,
        description="Expire after this long, e.g. '30d' or 3600 (at most 100 years: a longer one expires then).",
    )
    expires_at: Rfc3339 | None = Field(
        None, description="Expire at this time (with its time zone); one already past is refused (422)."
    )

    @model_validator(mode="after")
    def _one_expiry(self) -> TokenIn:
        if self.expires_in is not None and self.expires_at is not None:
            raise ValueError("give expires_in or expires_at, not both")
        return self

    def past(self, now: datetime) -> str | None:
        """Why the token asked for could not be used, created at `now` (its expires_at already past), or None.
        (The schema cannot say it: it is a matter of when the request comes.)"""
        if self.expires_at is not None and self.expires_at <= now:
            return f"expires_at {self.expires_at.isoformat()} is already past"
        return None

    def expiry(self, now: datetime) -> datetime | None:
        """When the token expires, if it does, for one created at `now`."""
        return self.expires_at if self.expires_in is None else self.expiry_after(self.expires_in, now)

    @staticmethod
    def expiry_after(seconds: float | None, now: datetime) -> datetime | None:
        return None if seconds is None else now + timedelta(seconds=min(seconds, MAX_TOKEN_SECONDS))


class TokenOut(Out):
    """A token as listed: never the token nor its hash."""

    id: str = Field(description="What revokes it: DELETE /v1/admin/tokens/{id}.")
    tenant: str
    user: str
    admin: bool
    created: datetime | None = Field(None, description="None for a token written by hand or by the settings.")
    expires: datetime | None = Field(None, description="None: it does not expire.")
    inline: bool = Field(False, description="Set by GPUYARD_TOKENS (the settings): revoked there, not here.")


class TokenCreated(TokenOut):
    token: str = Field(description="The bearer token, shown this once: only its hash is kept.")
