"""Reading job logs from the data directory (the executor writes them; logs never travel on the bus)."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from shared.paths import log_path


def read_log(data_dir: Path, job_id: str, attempt: int, replica: int, tail: int | None) -> str:
    path = log_path(data_dir, job_id, attempt, replica)
    if not path.exists():
        return ""
    with path.open("r", errors="replace") as f:
        return "".join(deque(f, maxlen=tail)) if tail else f.read()


async def follow_log(
    data_dir: Path,
    job_id: str,
    attempt: int,
    replica: int,
    tail: int | None,
    finished: Callable[[], Awaitable[bool]],
    poll: float = 0.25,
) -> AsyncIterator[bytes]:
    path = log_path(data_dir, job_id, attempt, replica)
    if tail:
        text = await asyncio.to_thread(read_log, data_dir, job_id, attempt, replica, tail)
        yield text.encode()
        offset = path.stat().st_size if path.exists() else 0
    else:
        offset = 0
    while True:
        done = await finished()  # read before the file: the last bytes are written before the job ends
        if path.exists():
            with path.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            if chunk:
                offset += len(chunk)
                yield chunk
        if done:
            return
        await asyncio.sleep(poll)
