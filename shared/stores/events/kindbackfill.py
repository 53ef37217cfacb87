"""How a store made before streams had a kind (`StreamKind`) is brought to them: which kind each stream of
such a store is of, and the state each of its projections takes. Before, the store told its streams apart by
their ids' prefixes and by projection states that were none of a job's; both backends' migrations read this
one definition (`sqliteschema.py`, `mongoschema.py`), once per store.

The states on the right are the read models' own (`gpuyard.shared.stores.readmodels`); a migration is a
record of one change, so they are written here as they were when it was made."""

from __future__ import annotations

from gpuyard.shared.stores.events.base import StreamKind

RENAMED_STATES: dict[str, tuple[StreamKind, str]] = {
    "alert-active": (StreamKind.ALERT, "active"),
    "alert-resolved": (StreamKind.ALERT, "resolved"),
    "model": (StreamKind.MODEL, "private"),
    "model-public": (StreamKind.MODEL, "public"),
    "model-removed": (StreamKind.MODEL, "removed"),
}
"""A projection's former state -> its kind and its state now."""
NODE_CONTROL = "node-control"
"""A node's projection's former state: its state now is the node's own, from its document."""
NODE_FLAGS: list[tuple[str, str]] = [("draining", "draining"), ("cordoned", "cordoned")]
"""The first of these flags the node's document holds set is its state (`NodeControl.state`)..."""
NODE_READY = "ready"
"""...and with neither, this one."""
ID_PREFIXES: dict[str, StreamKind] = {
    "/alerts/": StreamKind.ALERT,
    "/nodes/": StreamKind.NODE,
    "/idle/": StreamKind.IDLE,
    "model:": StreamKind.MODEL,
}
"""The id prefix of a stream of another kind than a job's -> that kind (for the events: the idle streams have
no projection). Every other stream is a job's."""


def id_range(prefix: str) -> tuple[str, str]:
    """The ids that begin with `prefix`: from `prefix` (included) to this end (excluded), a range an index
    on the id answers."""
    return prefix, prefix[:-1] + chr(ord(prefix[-1]) + 1)
