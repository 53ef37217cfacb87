"""The event store's documents: state that one writer replaces as a whole and that has no history worth
keeping (the queue's line, `shared/stores/readmodels/queueline.py`)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class DocumentStore(ABC):
    """Documents by key, each replaced whole."""

    @abstractmethod
    async def put_document(self, key: str, doc: dict[str, Any]) -> None:
        """Store `doc` whole under `key`, in place of what was there."""

    @abstractmethod
    async def get_document(self, key: str) -> dict[str, Any] | None:
        """The document last stored under `key`; None when there is none."""
