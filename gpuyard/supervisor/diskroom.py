"""Room on the disk of NATS's store for JetStream: the check `gpuyard up` makes before it starts anything
(`jetstream_room`), and when a disk that was full has room again (`room_again`, which heals JetStream)."""

from __future__ import annotations

import os
from pathlib import Path

from gpuyard.shared.contracts.events.subjects import STREAMS
from gpuyard.shared.contracts.units import format_size

JETSTREAM_SHARE = (3, 4)
"""nats-server takes this share of its store's free disk space as JetStream's storage (no `max_file_store`):
at most 3/4 of what is free when it starts."""
ROOM_AGAIN = 64 << 20
"""Free space (at most an eighth of the file system) after which NATS is restarted to heal its streams."""


def free_space(path: Path) -> tuple[int, int]:
    """(bytes free to an unprivileged writer, bytes in all) of the file system holding `path` (or the
    nearest folder above it that exists), counted in blocks as nats-server counts them."""
    while not path.exists() and path != path.parent:
        path = path.parent
    st = os.statvfs(path)
    return st.f_bavail * st.f_bsize, st.f_blocks * st.f_frsize


def jetstream_room(data_dir: Path, stream_max_bytes: int, streams: int = len(STREAMS)) -> str | None:
    """None when nats-server, started on `data_dir`, can reserve each of its `streams` streams'
    `stream_max_bytes` (it refuses to create or update one beyond 3/4 of the free space it saw at its start, and
    every service declares them when it starts); else the one line that says so and what to change."""
    if stream_max_bytes <= 0:
        return None
    free, _ = free_space(data_dir)
    usable = free * JETSTREAM_SHARE[0] // JETSTREAM_SHARE[1]
    need = streams * stream_max_bytes
    if need <= usable:
        return None
    fits = usable // streams
    smaller = f"{fits >> 20}MiB" if fits >= 1 << 20 else f"{fits}"
    short = -(-need * JETSTREAM_SHARE[1] // JETSTREAM_SHARE[0]) - free
    return (
        f"the data dir {data_dir} has {format_size(free)} free, and JetStream needs {streams} × "
        f"{format_size(stream_max_bytes)} for its streams (GPUYARD_STREAM_MAX_BYTES) within 3/4 of it: free "
        f"{format_size(short)} more there, or set GPUYARD_STREAM_MAX_BYTES={smaller} or less"
    )


def room_again(store: Path) -> bool:
    """Whether the file system of NATS's store has room again (ROOM_AGAIN, or an eighth of a smaller one)."""
    try:
        free, size = free_space(store)
    except OSError:
        return False
    return free >= min(ROOM_AGAIN, size // 8)
