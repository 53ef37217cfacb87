"""Which process is a running replica of this node, and what it runs with: its environment, working directory,
user and groups, cgroup and mount namespace, read from its first process (the local backend's pid file names
it, `pidfiles.py`), so that a command run beside it (`localexec.py`) gets the same, on a replica this executor
started or adopted, or another executor process of the node did."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from gpuyard.services.executor.pidfiles import PidRecord, read_pid_files
from gpuyard.services.executor.processes import process_start_time

JOB_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")


class NoReplica(Exception):
    """The replica asked for is not running here; `status` is the HTTP status the gateway answers (404 or 409)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class ReplicaKey:
    job_id: str
    attempt: int
    replica: int

    def __str__(self) -> str:
        return f"job {self.job_id} replica {self.replica}"


@dataclass(frozen=True)
class ReplicaProcess:
    """The first process of a running replica, and what a command run beside it gets."""

    pid: int
    start: int | None
    env: dict[str, str]
    cwd: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    cgroup: str | None
    mount_ns: str | None
    """Its mount namespace (`/proc/<pid>/ns/mnt`) where it differs from the executor's; None: the same."""

    def alive(self) -> bool:
        return self.start is not None and process_start_time(self.pid) == self.start


def read_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    env = {}
    for item in raw.split(b"\0"):
        name, sep, value = item.partition(b"=")
        if sep and name:
            env[name.decode(errors="surrogateescape")] = value.decode(errors="surrogateescape")
    return env


def read_ids(pid: int) -> tuple[int, int, tuple[int, ...]]:
    """The process's real uid and gid and its supplementary groups (/proc/<pid>/status)."""
    uid = gid = -1
    groups: tuple[int, ...] = ()
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key == "Uid":
            uid = int(value.split()[0])
        elif key == "Gid":
            gid = int(value.split()[0])
        elif key == "Groups":
            groups = tuple(int(g) for g in value.split())
    return uid, gid, groups


def other_mount_ns(pid: int) -> str | None:
    theirs = os.readlink(f"/proc/{pid}/ns/mnt")
    return None if theirs == os.readlink("/proc/self/ns/mnt") else f"/proc/{pid}/ns/mnt"


def process_of(pid: int, start: int | None, cgroup: str | None) -> ReplicaProcess:
    """What the replica's first process runs with; OSError when it cannot be read (gone meanwhile)."""
    uid, gid, groups = read_ids(pid)
    return ReplicaProcess(
        pid=pid,
        start=start,
        env=read_environ(pid),
        cwd=os.readlink(f"/proc/{pid}/cwd"),
        uid=uid,
        gid=gid,
        groups=groups,
        cgroup=cgroup,
        mount_ns=other_mount_ns(pid),
    )


class LocalReplicas:
    """The local backend's replicas on this node, found by their pid files in the data dir."""

    def __init__(self, data_dir: Path, node: str):
        self.data_dir = data_dir
        self.node = node

    def running(self, key: ReplicaKey) -> PidRecord:
        """The replica's pid record, its first process still running; NoReplica otherwise."""
        if not JOB_ID.fullmatch(key.job_id) or key.attempt < 1 or key.replica < 0:
            raise NoReplica(404, f"no {key}")
        records = {r.replica: r for r in read_pid_files(self.data_dir, key.job_id, key.attempt, self.node)}
        record = records.get(key.replica)
        if record is None:
            raise NoReplica(404, f"{key} does not run on node {self.node}")
        if record.start is None or process_start_time(record.pid) != record.start:
            raise NoReplica(409, f"{key} has ended")
        return record

    def find(self, key: ReplicaKey) -> ReplicaProcess:
        """The replica's first process and what it runs with; NoReplica when it does not run here."""
        record = self.running(key)
        try:
            found = process_of(record.pid, record.start, record.cgroup)
        except OSError as exc:
            raise NoReplica(409, f"{key} has ended ({exc.strerror or exc})") from None
        if not found.alive():  # (its pid reused while it was read)
            raise NoReplica(409, f"{key} has ended")
        return found
