"""Failure causes that only a job's output reveals. Backend-neutral: the local backend can reuse it."""

from __future__ import annotations

import re
from collections.abc import Iterable

from shared.events import FailureReason

_CUDA_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|CUDA_ERROR_OUT_OF_MEMORY|cudaErrorMemoryAllocation",
    re.IGNORECASE,
)


def classify_log_tail(lines: Iterable[str]) -> FailureReason | None:
    """CUDA_OOM when the output shows the GPU ran out of memory, else None (nothing recognised)."""
    return FailureReason.CUDA_OOM if any(_CUDA_OOM.search(line) for line in lines) else None
