"""Free TCP ports for the benchmarks' own servers, so that two runs on one machine never collide: `gpuyard up`'s
own picking (`gpuyard/supervisor/ports.py`: below the kernel's ephemeral range)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from gpuyard.supervisor import ports  # noqa: E402


def free_ports(n: int) -> list[int]:
    return ports.free_ports("127.0.0.1", n)
