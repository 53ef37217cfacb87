"""Why a job waits: the closed set of pending-reason codes, one definition for the scheduler, the API schema,
the CLI, the dashboard and the docs.

Codes rank like Kueue's fit modes: NO_FIT (nothing the scheduler does now will place the job: the cluster is
too small, no GPU of that model, retry backoff, quota, user cap, busy resources…) < PREEMPT (room is being
made by preempting other jobs) < FIT (it would fit but waits its turn: strict order or a backfill
reservation). When several reasons apply, the one of lowest (rank, code) is shown.
"""

from __future__ import annotations

from enum import IntEnum, StrEnum

from gpuyard.shared.contracts.units import format_rough_duration


class Fit(IntEnum):
    """How close a waiting job is to running; a job's answer is the worst over its parts."""

    NO_FIT = 0
    PREEMPT = 1
    FIT = 2


class PendingCode(StrEnum):
    """Why a job waits, for machines: a closed set of codes, each with a rank (`Fit`) and a meaning."""

    RETRY_BACKOFF = "retry_backoff"
    NO_NODES = "no_nodes"
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
    NO_PYTHON = "no_python"

    @property
    def rank(self) -> Fit:
        return _RANK[self]

    @property
    def meaning(self) -> str:
        return _MEANING[self]


_C = PendingCode
_RANK: dict[PendingCode, Fit] = {
    **{code: Fit.NO_FIT for code in PendingCode},
    _C.PREEMPTING: Fit.PREEMPT,
    _C.BLOCKED_BY_HEAD: Fit.FIT,
    _C.BACKFILL_WOULD_DELAY: Fit.FIT,
}
_MEANING: dict[PendingCode, str] = {
    _C.RETRY_BACKOFF: "waits out the backoff before its next attempt",
    _C.NO_NODES: "no node has joined the platform yet",
    _C.TOO_LARGE: "asks for more than the largest node has",
    _C.NO_MATCHING_GPU_MODEL: "no node has the GPU model it asks for",
    _C.QUOTA_EXHAUSTED: "its tenant is at its quota and no idle GPUs can be borrowed",
    _C.BORROWING_DISABLED: "its tenant is at its quota and borrowing is off",
    _C.USER_CAP: "its user holds the most GPUs one user of the tenant may hold",
    _C.INSUFFICIENT_GPUS: "not enough free whole GPUs on one node",
    _C.INSUFFICIENT_GPU_SHARE: "no GPU has the free share it asks for",
    _C.INSUFFICIENT_CPU_MEMORY: "the nodes with free GPUs lack the CPUs or memory it asks for",
    _C.GANG_DOES_NOT_FIT: "its replicas cannot all be placed together yet",
    _C.PREEMPTING: "other jobs are being preempted to make room for it",
    _C.BLOCKED_BY_HEAD: "strict order: it waits behind the job at the head of the queue",
    _C.BACKFILL_WOULD_DELAY: "it fits now but would delay the reserved start of the job at the head",
    _C.NO_PYTHON: "no node offers the Python version its environment asks for",
}
assert set(_MEANING) == set(PendingCode), "every pending code has a meaning"

WAITING_ITS_TURN = frozenset(  # busy resources, soon free: the reason is worth storing only if it lasts
    {
        _C.INSUFFICIENT_GPUS,
        _C.INSUFFICIENT_GPU_SHARE,
        _C.INSUFFICIENT_CPU_MEMORY,
        _C.GANG_DOES_NOT_FIT,
        _C.BLOCKED_BY_HEAD,
        _C.BACKFILL_WOULD_DELAY,
    }
)
RESOURCE_CODES = frozenset(
    {
        _C.INSUFFICIENT_GPUS,
        _C.INSUFFICIENT_GPU_SHARE,
        _C.INSUFFICIENT_CPU_MEMORY,
        _C.GANG_DOES_NOT_FIT,
        _C.PREEMPTING,
    }
)
GPU_SHORTAGES = frozenset({_C.INSUFFICIENT_GPUS, _C.INSUFFICIENT_GPU_SHARE, _C.GANG_DOES_NOT_FIT})


def ordinal(n: int) -> str:
    """'1st', '2nd', '3rd', '11th', '22nd'."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def waiting_message(text: str, position: int | None, start_in: float | None) -> str:
    """A pending reason's sentence for people: its core (`text`), the job's place in line, and the estimated
    start `start_in` seconds from now (each left out when not known). The scheduler's and the API's one
    rendering: the API renders it again with the place the queue's line says now (`shared/stores/readmodels/queueline.py`)."""
    message = text if position is None else f"{text}; {ordinal(position)} in line"
    if start_in is not None:
        message += f"; estimated start in about {format_rough_duration(start_in)}"
    return message
