"""The event store's projections: the read model of each stream, stored with the events that produced it, for
fast listing. Every query reads the projections of jobs (`StreamKind.JOB`) alone; `get_projection`,
`list_projections` and `count_projections` read another kind's when asked (a read model's own: alerts, models,
nodes), so that no reader of jobs ever meets another kind's projection, whatever its state."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from gpuyard.shared.stores.events.base import EndedJob, Order, Page, StreamKind


class Projections(ABC):
    """Reads the projections: one by id, listings and counts, and the figures of jobs the services follow."""

    @abstractmethod
    async def get_projection(
        self, stream_id: str, *, kind: StreamKind = StreamKind.JOB
    ) -> dict[str, Any] | None:
        """The projection's document of the stream `stream_id` if it is of `kind`; None otherwise."""

    @abstractmethod
    async def list_projections(
        self,
        *,
        states: list[str] | None = None,
        tenant: str | None = None,
        user: str | None = None,
        name: str | None = None,
        search: str | None = None,
        order: Order = "newest",
        limit: int = 50,
        cursor: str | None = None,
        kind: StreamKind = StreamKind.JOB,
    ) -> Page:
        """The projections of `kind` newest first (by creation time; `order="oldest"`: oldest first),
        paginated by cursor, filtered by state, tenant, the document's `user` and `name` (exact), and
        `search`: a substring of the stream id, the document's name or user, or the tenant, the case of ASCII
        letters aside (`%` and `_` are themselves). Raises ValueError for a cursor it did not make (or made
        for the other order)."""

    @abstractmethod
    async def count_projections(
        self,
        *,
        states: list[str] | None = None,
        tenant: str | None = None,
        user: str | None = None,
        name: str | None = None,
        search: str | None = None,
        kind: StreamKind = StreamKind.JOB,
    ) -> int:
        """How many projections `list_projections` with these filters lists over all its pages."""

    @abstractmethod
    async def versions(self, *, states: list[str], created_before: str | None = None) -> dict[str, int]:
        """Job id -> version of every job in one of `states` (created before `created_before`, ISO 8601, when
        given): what a reader that holds the jobs compares its own versions with, to re-read only those that
        changed (no document is decoded)."""

    @abstractmethod
    async def count_by_tenant(self, *, states: list[str]) -> dict[str, int]:
        """Tenant -> how many of its jobs are in one of `states` (tenants with none are left out)."""

    @abstractmethod
    async def oldest_by_tenant(self, *, states: list[str]) -> dict[str, str]:
        """Tenant -> the creation time (ISO 8601) of its oldest job in one of `states` (tenants with none are
        left out): how long its queue has waited."""

    @abstractmethod
    async def ended_since(self, after: str, *, limit: int = 1000) -> list[EndedJob]:
        """Up to `limit` jobs that reached a final state at `after` (ISO 8601) or later, in the order of that
        time (then of id): the feed of jobs ending, whatever state they ended from (a reader that pages it
        passes the last time it saw, and passes over the ids it saw at that time)."""

    @abstractmethod
    async def ids_starting(self, prefix: str, *, tenant: str | None = None, limit: int = 10) -> list[str]:
        """Up to `limit` job ids that begin with `prefix` (of `tenant`'s jobs only, when given), in order: a
        unique prefix names one job, as a unique prefix of a commit names it to git."""
