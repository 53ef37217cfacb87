"""What nats-server does on a full disk, which `gpuyard up` works around (docs/operations.md, "A full disk"):
a stream that failed a write (ENOSPC) keeps refusing every publish, unacknowledged, after space is back, until
nats-server restarts; a restart heals it. On a disk with less room than the streams' reservation, nats-server
refuses to declare even an existing stream again: a service keeps it as it is, and still starts."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import subprocess
from pathlib import Path

import pytest
from nats.js.errors import APIError

from gpuyard.shared.bus.jetstream import INSUFFICIENT_STORAGE, Bus
from gpuyard.shared.contracts.events.subjects import STREAMS, TELEMETRY_STREAM, StreamDef, Subject
from tests.integration.conftest import BIN, free_port, wait_for
from tests.integration.test_full_disk import mount_small, unmount

pytestmark = pytest.mark.integration

MiB = 1 << 20
ACK_SECONDS = 2.0


class Nats:
    """A nats-server with JetStream whose store is on `disk`, its output in `log`."""

    def __init__(self, disk: Path, log: Path):
        self.disk, self.log, self.port = disk, log, free_port()
        self.proc: subprocess.Popen | None = None
        self.since = 0

    def start(self) -> Nats:
        self.since = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(BIN / "nats-server"), "-js", "-sd", str(self.disk / "nats"), "-a", "127.0.0.1"]
                + ["-p", str(self.port)],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_for(lambda: "Server is ready" in self.said(), 30, 0.05, "nats-server")
        return self

    def said(self) -> str:
        """What it said since its last start."""
        return self.log.read_bytes()[self.since :].decode(errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(30)


def fill(disk: Path, leave: int = 0) -> Path:
    """A file that takes all the free space of `disk` but `leave` bytes (about: a page or so)."""
    filler = disk / "filler"
    with filler.open("wb") as f, contextlib.suppress(OSError):
        free = _free(disk) - leave
        while free > 0:
            f.write(b"\0" * min(free, 1 << 16))
            f.flush()
            free -= 1 << 16
    return filler


def _free(disk: Path) -> int:
    import os

    st = os.statvfs(disk)
    return st.f_bavail * st.f_bsize


async def published(bus: Bus, payload: bytes = b"{}") -> bool:
    """Whether a publish on the telemetry stream is acknowledged."""
    try:
        await bus.js.publish(Subject.NODE_HEARTBEAT.value, payload, timeout=ACK_SECONDS)
    except (TimeoutError, APIError):
        return False
    return True


async def until_published(bus: Bus, within: float = 60) -> None:
    """Once the client is connected again (after a restart of nats-server), a publish is acknowledged."""
    deadline = asyncio.get_running_loop().time() + within
    while not (bus.nc.is_connected and await published(bus)):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"no publish acknowledged within {within:.0f}s of the restart")
        await asyncio.sleep(0.1)


async def until_refused(bus: Bus) -> bool:
    """Publish until one is not acknowledged (what is written to a file on a full disk may first fill what is
    left of its last page)."""
    for _ in range(64):
        if not await published(bus, b"x" * (32 << 10)):
            return True
    return False


@pytest.fixture
def disk(tmp_path):
    where = mount_small(tmp_path / "disk")
    yield where
    unmount(where)


async def test_a_stream_that_failed_a_write_heals_with_a_restart_and_is_kept_on_a_tighter_disk(
    disk, tmp_path, caplog
):
    nats = Nats(disk, tmp_path / "nats.log").start()
    streams: tuple[StreamDef, ...] = tuple(s.limited(MiB, -1) for s in STREAMS)  # 3 MiB: within 3/4 of 8 MiB
    url = f"nats://127.0.0.1:{nats.port}"
    bus = await Bus.connect([url], name="test", source="/test")
    try:
        await bus.ensure_streams(streams)
        assert await published(bus)

        filler = fill(disk)
        assert await until_refused(bus)
        wait_for(
            lambda: f"'$G > {TELEMETRY_STREAM.name}' critical write error" in nats.said(),
            30,
            0.1,
            "the error",
        )
        filler.unlink()
        assert _free(disk) > 4 * MiB
        assert not await published(bus)  # space is back, and the stream still refuses: nats-server's way

        nats.stop()
        nats.start()
        await until_published(bus)  # healed by the restart

        nats.stop()
        filler = fill(disk, leave=2 * MiB)  # 3/4 of what is left cannot hold 3 × 1 MiB
        nats.start()
        await until_published(bus)
        caplog.clear()
        await bus.ensure_streams(streams)  # every stream exists: kept as it is, no error
        kept = [r.getMessage() for r in caplog.records if "kept as it is" in r.getMessage()]
        assert len(kept) == len(streams) and "insufficient storage" in kept[0]
        extra = StreamDef(
            name="EXTRA", subjects=["extra.>"], max_age_seconds=60, max_bytes=MiB, description="x"
        )
        with pytest.raises(APIError) as refused:  # a new one: nats-server refuses its reservation
            await bus.ensure_streams((extra,))
        assert refused.value.err_code == INSUFFICIENT_STORAGE
        filler.unlink()
    finally:
        await bus.nc.close()
        nats.stop()


def test_a_full_disk_is_enospc_here(disk):
    """(The tmpfs the tests mount keeps nothing back: filling it leaves no byte for anyone.)"""
    fill(disk)
    with pytest.raises(OSError) as full, (disk / "more").open("wb") as f:
        f.write(b"\0" * (1 << 16))
        f.flush()
    assert full.value.errno == errno.ENOSPC
