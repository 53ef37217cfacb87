"""Why a job waits, as the scheduler renders it: a code with its numbers, made into one sentence.

The codes, their ranks (NO_FIT < PREEMPT < FIT) and meanings are `gpuyard.shared.contracts.reasons.PendingCode`, the one
definition the API, the CLI and the docs share. When several reasons apply, the one of lowest (rank, code) is
shown, so the first is always the same.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from gpuyard.shared.contracts.reasons import PendingCode, waiting_message


class Reason:
    """Why a job waits. `code` is for machines, `message` (with numbers) for people, `details` the numbers.

    `code` is a `PendingCode`; `position` is the job's place in line among the waiting jobs (1 = next; None for
    a job no node could ever hold, `NEVER_HELD`: it has no place in line and is not counted in the others');
    `estimated_start` is on the caller's clock, None when it cannot be known. `message` is rendered when read
    (`text`, the place in line, the estimated start as a duration from `now`): a cycle gives every waiting job
    a reason, and most are only looked at by code and position.
    """

    __slots__ = ("code", "text", "details", "position", "estimated_start", "now")

    def __init__(
        self,
        code: PendingCode,
        text: str,
        details: dict[str, Any],
        position: int | None = None,
        estimated_start: float | None = None,
        now: float = 0.0,
    ) -> None:
        self.code = code
        self.text = text
        self.details = details
        self.position = position
        self.estimated_start = estimated_start
        self.now = now

    @property
    def message(self) -> str:
        start_in = None if self.estimated_start is None else self.estimated_start - self.now
        return waiting_message(self.text, self.position, start_in)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not Reason:
            return NotImplemented
        return _SEEN(self) == _SEEN(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        fields = zip(_SEEN_NAMES, _SEEN(self), strict=True)
        return f"Reason({', '.join(f'{name}={value!r}' for name, value in fields)})"


_SEEN_NAMES = ("code", "message", "details", "position", "estimated_start")
_SEEN = attrgetter(*_SEEN_NAMES)  # what a reader sees: equal reasons read the same


NEVER_HELD = frozenset({PendingCode.TOO_LARGE, PendingCode.NO_MATCHING_GPU_MODEL, PendingCode.NO_PYTHON})
"""No node could ever hold the job (as the cluster is listed now; `explain.never_fits`): such a job has no place
in line and never counts in another job's. `no_nodes` is not among them: before any node has
joined, every job waits for the first ones and keeps its place."""


@dataclass(frozen=True, slots=True)
class Blocker:
    """A reason before it knows its place in line: code, the sentence's core and its numbers.

    `in_line`: whether a job with this reason has a place in line (not `NEVER_HELD`); `at` gives a job out of
    line no position, whatever it is passed, and a cycle does not count it."""

    code: PendingCode
    text: str
    details: dict[str, Any]
    in_line: bool = field(init=False, compare=False, repr=False)  # (read for every waiting job)

    def __post_init__(self) -> None:
        object.__setattr__(self, "in_line", self.code not in NEVER_HELD)

    def at(self, position: int | None, estimated_start: float | None = None, now: float = 0.0) -> Reason:
        return Reason(
            self.code, self.text, self.details, position if self.in_line else None, estimated_start, now
        )


def gpus_text(gpus: float) -> str:
    if gpus >= 1:
        n = round(gpus)
        return f"{n} whole GPU" if n == 1 else f"{n} whole GPUs"
    return f"{gpus:g} of a GPU"
