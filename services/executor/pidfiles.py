"""A replica's files on the node: its folders, and its pid file (`replica-<r>.pid` beside its log, written by
its reaper: pid and start time against pid reuse, node, cgroup, the reaper's pid and start time and the
number of its descriptor of the replica's output pipe, its job's tenant), which lets a restarted executor
find what an earlier one started."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from gpuyard.shared.runtime.paths import ReplicaFiles, attempt_dir, private_dir, replica_files


def pid_file(data_dir: Path, job_id: str, attempt: int, replica: int) -> Path:
    return Path(replica_files(data_dir, job_id, attempt, replica).pid)


def make_replica_dirs(files: ReplicaFiles, *, work: bool = True) -> None:
    """The job's, the attempt's and (unless not `work`) the replica's working directory (0700), made from the
    deepest up: where the attempt's claim made its folders (several executor processes on the node), one
    mkdir call; otherwise one more per missing parent. (A start makes the attempt's alone, for its log and pid
    file: the replica's first process makes its working directory, `replicafolders.py`.)"""
    private_dir(files.work if work else files.attempt)


@dataclass(frozen=True)
class PidRecord:
    path: Path
    replica: int
    pid: int
    start: int | None
    node: str
    cgroup: str | None
    reaper: int | None = None
    reaper_start: int | None = None
    fd: int | None = None
    """The reaper's descriptor of the replica's output pipe (`/proc/<reaper>/fd/<fd>` opens the pipe again)."""
    shell: bool = False
    """Its command is a shell's (exit code 127: command not found)."""
    memory: int = 0
    """Its cgroup's memory limit (for the message of an out-of-memory kill)."""
    tenant: str = ""
    """Its job's tenant, whose log budget its output counts against; empty in a pid file written by an executor
    that did not record it (its output, adopted, then counts against no budget)."""


def read_pid_files(data_dir: Path, job_id: str, attempt: int, node: str) -> list[PidRecord]:
    records = []
    folder = attempt_dir(data_dir, job_id, attempt)
    for path in sorted(folder.glob("replica-*.pid")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
            replica = int(path.stem.removeprefix("replica-"))
        except (OSError, ValueError):
            continue
        if doc.get("node") == node:
            records.append(
                PidRecord(
                    path,
                    replica,
                    int(doc["pid"]),
                    doc.get("start"),
                    node,
                    doc.get("cgroup"),
                    doc.get("reaper"),
                    doc.get("reaper_start"),
                    doc.get("fd"),
                    bool(doc.get("shell")),
                    int(doc.get("memory") or 0),
                    str(doc.get("tenant") or ""),
                )
            )
    return records
