"""`gpuyard up` checks, before it starts anything, that JetStream can reserve its streams on the data dir's
disk (nats-server takes at most 3/4 of the space free at its start, and refuses a stream it cannot reserve,
every service declaring them at its start): too little room is one line naming the setting to change."""

from __future__ import annotations

import asyncio
import io
import re

import pytest
from rich.console import Console

from gpuyard.shared.contracts.events.subjects import STREAMS
from gpuyard.shared.contracts.units import parse_size
from gpuyard.supervisor import diskroom, natsserver, ports, up

MiB = 1 << 20


@pytest.fixture
def free(monkeypatch):
    """Set the free space `jetstream_room` sees."""
    seen: dict[str, int] = {"free": 0}
    monkeypatch.setattr(diskroom, "free_space", lambda _path: (seen["free"], 100 * seen["free"] + 1))
    return seen


def test_room_for_every_stream_within_three_quarters_of_the_free_space_is_enough(free, tmp_path):
    free["free"] = 4 * 1024 * MiB
    assert diskroom.jetstream_room(tmp_path, 1024 * MiB) is None  # 3 × 1 GiB = 3/4 of 4 GiB, just
    assert diskroom.jetstream_room(tmp_path, 0) is None  # no limit: nothing reserved


def test_too_little_room_is_one_line_with_the_setting_and_a_value_that_fits(free, tmp_path):
    free["free"] = 4 * 1024 * MiB - 1
    line = diskroom.jetstream_room(tmp_path, 1024 * MiB)
    assert line is not None and "\n" not in line
    assert str(tmp_path) in line and f"{len(STREAMS)} × 1 GiB" in line
    smaller = re.search(r"GPUYARD_STREAM_MAX_BYTES=(\S+) or less", line).group(1)
    assert diskroom.jetstream_room(tmp_path, parse_size(smaller)) is None
    assert "free 1 B more there" in line


def test_the_check_reads_the_disk_of_the_nearest_folder_that_exists(tmp_path):
    free, size = diskroom.free_space(tmp_path / "not" / "made" / "yet")
    assert 0 <= free <= size and size > 0


def test_gpuyard_up_says_so_before_it_starts_anything(free, tmp_path, monkeypatch):
    """The data dir's disk too small for the default reservation (3 × 1 GiB): `run_up` ends with the line,
    and no process was started (NATS' binary is never even looked for)."""
    monkeypatch.setenv("GPUYARD_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("GPUYARD_STREAM_MAX_BYTES", raising=False)
    monkeypatch.setattr(natsserver, "nats_server_binary", lambda: pytest.fail("NATS looked for"))
    free["free"] = 100 * MiB
    api, nats, serving, monitor = ports.free_ports("127.0.0.1", 4)
    given = {"data_dir": str(tmp_path / "data"), "submit_port": api, "serving_port": serving}
    opts = up.UpOptions(given={**given, "metrics_port": monitor}, nats_port=nats)
    with pytest.raises(SystemExit) as ended:
        asyncio.run(up.run_up(opts, Console(file=io.StringIO())))
    assert "GPUYARD_STREAM_MAX_BYTES=" in str(ended.value) and "100 MiB free" in str(ended.value)
