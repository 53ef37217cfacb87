"""Facts about the node (what it can enforce, its GPU watch, who jobs run as), said once per node: by the
executor process that announces it (worker 0). The node's other executor processes keep them at debug."""

from __future__ import annotations

import logging

node_log = logging.getLogger("gpuyard.node")


def said_by(worker: int) -> None:
    """Only worker 0 says the node's facts."""
    if worker:
        node_log.setLevel(logging.ERROR)
