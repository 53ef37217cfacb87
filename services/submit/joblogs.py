"""A job's output as `GET /v1/jobs/{id}/logs` reads it from the log store: one attempt's (its last lines, a
byte range, or followed until the attempt is over), or every attempt's in order, each after a line of the
platform's that names it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from fastapi import HTTPException, status

from gpuyard.services.submit.context import SubmitContext
from gpuyard.shared.contracts.jobstate import JobState, JobView
from gpuyard.shared.stores.logs.base import NOTE, LogKey, LogStore
from gpuyard.shared.stores.logs.reading import follow as follow_log
from gpuyard.shared.stores.logs.reading import read_range, tail_start

ALL_ATTEMPTS = "all"
ATTEMPT_PATTERN = rf"^([1-9][0-9]{{0,8}}|{ALL_ATTEMPTS})$"
"""`?attempt=`: an attempt's number, or every attempt's output."""


def attempt_number(view: JobView, attempt: str | None) -> int:
    """The attempt `?attempt=N` names (the latest when not given); 404 past the job's attempts."""
    number = int(attempt) if attempt else view.attempt
    if number > view.attempt:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"job {view.job_id} has {view.attempt} attempt(s)")
    return number


async def one_attempt(
    ctx: SubmitContext, key: LogKey, tail: int | None, follow: bool
) -> AsyncIterator[bytes]:
    """One attempt's output of one replica (`tail`: its last lines); `follow`: until the attempt is over."""
    start = await _tail_start(ctx, key, tail)
    if not follow:
        return read_range(ctx.logs, key, start)
    return follow_log(ctx.logs, key, start, _attempt_over(ctx, key.job_id, key.attempt))


async def _tail_start(ctx: SubmitContext, key: LogKey, tail: int | None) -> int:
    """Where the output sent begins: its first byte, or where its last `tail` lines begin."""
    if tail and (extent := await ctx.logs.extent(key)) is not None:
        return await tail_start(ctx.logs, key, tail, extent)
    return 0


def _attempt_over(ctx: SubmitContext, job_id: str, number: int) -> Callable[[], Coroutine[Any, Any, bool]]:
    """Whether attempt `number` of the job is over (the job ended, or moved on to another attempt)."""

    async def finished() -> bool:
        doc = await ctx.store.get_projection(job_id)
        return doc is None or doc["attempt"] != number or JobState(doc["state"]).terminal

    return finished


def attempt_line(view: JobView, number: int) -> bytes:
    """The platform's line that opens an attempt's output when every attempt's is sent: its number, how it
    ended (`requeued: node_lost`, `failed: exit_code`…) with why, or its state while it is the job's current
    one (`running`, `queued`…); on one line."""
    found = next((a for a in view.attempts if a.number == number), None)
    said = found.summary if found is not None else None
    if said is None:
        said = view.state.value if number == view.attempt else "ended"
    message = found.message if found is not None and found.outcome else ""
    if message:
        said += f" ({message})"
    return f"{NOTE}attempt {number}: {' '.join(said.split())}\n".encode()


async def every_attempt(
    ctx: SubmitContext, view: JobView, replica: int, tail: int | None, follow: bool
) -> AsyncIterator[bytes]:
    """Every attempt's output of one replica, in order, each after its `attempt_line` (on a line of its own,
    even after output that did not end its last line). Following, the current attempt is followed until it
    is over, then the next one, until the job ends."""
    number, line_ended = 1, True
    while True:
        key = LogKey(view.job_id, number, replica)
        yield (b"" if line_ended else b"\n") + attempt_line(view, number)
        line_ended = True
        current = number == view.attempt
        following = follow and current and not view.state.terminal
        async for piece in await one_attempt(ctx, key, tail, following):
            yield piece
            line_ended = piece.endswith(b"\n")
        if following:
            doc = await ctx.store.get_projection(view.job_id)
            if doc is None:
                return
            view = JobView.model_validate(doc)  # (moved on: the next attempt is followed)
        if number >= view.attempt:
            return
        number += 1


async def byte_range(logs: LogStore, key: LogKey, header: str) -> tuple[int, int, int]:
    """RFC 9110 single byte ranges of the output kept (older output trimmed by the cap is not kept): the first
    and last bytes of `header`'s range, and the output's end. 400 for a range not understood, 416 for one
    outside what is kept."""
    extent = await logs.extent(key)
    end = extent.end if extent else 0
    kept = extent.start if extent else 0
    unit, _, spec = header.partition("=")
    first_text, dash, last_text = spec.strip().partition("-")
    if unit.strip() != "bytes" or not dash or "," in spec or not (first_text or last_text):
        raise HTTPException(
            status.HTTP_400_BAD_REQUEST, f"unsupported Range {header!r}: use bytes=FIRST-LAST"
        )
    try:
        if first_text:
            first = int(first_text)
            last = min(int(last_text), end - 1) if last_text else end - 1
        else:
            first, last = max(end - int(last_text), 0), end - 1
    except ValueError:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, f"unsupported Range {header!r}") from None
    first = max(first, kept)
    if first > last or first >= end:
        raise HTTPException(
            status.HTTP_416_RANGE_NOT_SATISFIABLE,
            f"the output kept is bytes {kept}-{end - 1}" if end > kept else "no output yet",
            headers={"Content-Range": f"bytes */{end}"},
        )
    return first, last, end
