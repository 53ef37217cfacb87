"""Whether a replica of the local backend listens on a TCP port: a listening socket on that port (IPv4 or IPv6)
held by one of its processes (its cgroup's, else its session's). The gateway forwards to a port only then, so
that a job's `ports` reach that job's own server, never another tenant's nor the platform's on the same node."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpuyard.services.executor.pidfiles import PidRecord
from gpuyard.services.executor.processes import session_members

LISTEN = "0A"
TABLES = ("/proc/net/tcp", "/proc/net/tcp6")
KEPT_SECONDS = 2.0
"""How long a port found held by a replica is taken as still held (one look per page, not one per request)."""


def host_of(hex_address: str) -> str:
    """Where to reach a listening socket bound to `hex_address` (/proc/net/tcp's form): its IPv4 address, or
    loopback for any address and for IPv6."""
    if len(hex_address) != 8:
        return "[::1]"
    address = ".".join(str(b) for b in reversed(bytes.fromhex(hex_address)))
    return "127.0.0.1" if address == "0.0.0.0" else address


def listening_inodes(port: int, tables: tuple[str, ...] = TABLES) -> dict[str, str]:
    """The sockets listening on `port`: inode -> the host to reach it at."""
    found = {}
    for table in tables:
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port:
                found[fields[9]] = host_of(fields[1].rsplit(":", 1)[0])
    return found


def replica_pids(target: PidRecord) -> list[int]:
    if target.cgroup:
        try:
            return [int(p) for p in (Path(target.cgroup) / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            pass
    return session_members(target.pid)


def held(pids: list[int], inodes: dict[str, str]) -> str | None:
    """The host of the first of `inodes` one of `pids` holds; None: none."""
    wanted = {f"socket:[{inode}]": host for inode, host in inodes.items()}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                host = wanted.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
            except OSError:
                continue
            if host is not None:
                return host
    return None


class Listeners:
    def __init__(self) -> None:
        self.seen: dict[tuple[int, int, int], tuple[float, str]] = {}

    def host(self, target: PidRecord, port: int) -> str | None:
        """Where the replica listens on `port` (None: it does not); a recent answer is kept `KEPT_SECONDS`."""
        key, now = (target.pid, target.start or 0, port), time.monotonic()
        until, host = self.seen.get(key, (0.0, ""))
        if until > now:
            return host
        inodes = listening_inodes(port)
        found = held(replica_pids(target), inodes) if inodes else None
        if found is None:
            self.seen.pop(key, None)
            return None
        if len(self.seen) > 1024:
            self.seen = {k: v for k, v in self.seen.items() if v[0] > now}
        self.seen[key] = (now + KEPT_SECONDS, found)
        return found
