"""Why a job waits: a closed set of codes, each with numbers, rendered into one sentence.

Codes rank like Kueue's fit modes: NO_FIT (nothing the scheduler does now will place the job: the cluster is
too small, no GPU of that model, retry backoff, quota, user cap, ...) < PREEMPT (room is being made by
preempting other jobs) < FIT (it would fit but waits its turn: strict order or a backfill reservation).
When several reasons apply, `sort_reasons` orders them by (rank, code) so the first is always the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from services.scheduler.core.model import Reason
from shared.units import format_rough_duration as duration

NO_FIT, PREEMPT, FIT = 0, 1, 2

RETRY_BACKOFF = "retry_backoff"
TOO_LARGE = "too_large"
NO_MATCHING_GPU_MODEL = "no_matching_gpu_model"
QUOTA_EXHAUSTED = "quota_exhausted"
BORROWING_DISABLED = "borrowing_disabled"
USER_CAP = "user_cap"
INSUFFICIENT_GPUS = "insufficient_gpus"
INSUFFICIENT_GPU_SHARE = "insufficient_gpu_share"
INSUFFICIENT_CPU_MEMORY = "insufficient_cpu_memory"
GANG_DOES_NOT_FIT = "gang_does_not_fit"
PREEMPTING = "preempting"
BLOCKED_BY_HEAD = "blocked_by_head"
BACKFILL_WOULD_DELAY = "backfill_would_delay"
GPU_SHORTAGES = frozenset({INSUFFICIENT_GPUS, INSUFFICIENT_GPU_SHARE, GANG_DOES_NOT_FIT})

RANK: dict[str, int] = {
    RETRY_BACKOFF: NO_FIT,
    TOO_LARGE: NO_FIT,
    NO_MATCHING_GPU_MODEL: NO_FIT,
    QUOTA_EXHAUSTED: NO_FIT,
    BORROWING_DISABLED: NO_FIT,
    USER_CAP: NO_FIT,
    INSUFFICIENT_GPUS: NO_FIT,
    INSUFFICIENT_GPU_SHARE: NO_FIT,
    INSUFFICIENT_CPU_MEMORY: NO_FIT,
    GANG_DOES_NOT_FIT: NO_FIT,
    PREEMPTING: PREEMPT,
    BLOCKED_BY_HEAD: FIT,
    BACKFILL_WOULD_DELAY: FIT,
}
CODES = frozenset(RANK)
RESOURCE_CODES = frozenset(
    {INSUFFICIENT_GPUS, INSUFFICIENT_GPU_SHARE, INSUFFICIENT_CPU_MEMORY, GANG_DOES_NOT_FIT, PREEMPTING}
)


@dataclass(frozen=True, slots=True)
class Blocker:
    """A reason before it knows its place in line: code, the sentence's core and its numbers."""

    code: str
    text: str
    details: dict[str, Any]

    def at(self, position: int, estimated_start: float | None = None, now: float = 0.0) -> Reason:
        suffix = "th" if 10 <= position % 100 <= 20 else _SUFFIX.get(position % 10, "th")
        message = (
            f"{self.text}; {position}{suffix} in line"  # ordinal(position), inlined (once per waiting job)
        )
        if estimated_start is not None:
            message += f"; estimated start in about {duration(estimated_start - now)}"
        return _reason(self.code, message, self.details, position, estimated_start)


_new = object.__new__
_SET_CODE, _SET_MESSAGE, _SET_DETAILS, _SET_POSITION, _SET_START = (
    Reason.__dict__[name].__set__ for name in ("code", "message", "details", "position", "estimated_start")
)


def _reason(code: str, message: str, details: dict, position: int, estimated_start: float | None) -> Reason:
    """`Reason(code, message, details, position, estimated_start)`, built through its slots: the frozen
    dataclass's `__init__` costs twice as much, and a cycle makes one per waiting job (an equal object)."""
    reason = _new(Reason)
    _SET_CODE(reason, code)
    _SET_MESSAGE(reason, message)
    _SET_DETAILS(reason, details)
    _SET_POSITION(reason, position)
    _SET_START(reason, estimated_start)
    return reason


def sort_reasons(blockers: list[Blocker]) -> list[Blocker]:
    return sorted(blockers, key=lambda b: (RANK[b.code], b.code, b.text))


_SUFFIX = {1: "st", 2: "nd", 3: "rd"}


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else _SUFFIX.get(n % 10, "th")
    return f"{n}{suffix}"


def gpus_text(gpus: float) -> str:
    if gpus >= 1:
        n = round(gpus)
        return f"{n} whole GPU" if n == 1 else f"{n} whole GPUs"
    return f"{gpus:g} of a GPU"


def gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.3g} GiB"
