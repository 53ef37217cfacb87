"""A replica's files on the node: its folders, and its pid file (`replica-<r>.pid` beside its log: pid, start
time against pid reuse, node, cgroup), which lets a restarted executor find what an earlier one started."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from shared.paths import ReplicaFiles, attempt_dir, private_dir, replica_files


def pid_file(data_dir: Path, job_id: str, attempt: int, replica: int) -> Path:
    return Path(replica_files(data_dir, job_id, attempt, replica).pid)


def write_pid_file(path: str, record: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, json.dumps(record).encode())
    finally:
        os.close(fd)


def make_replica_dirs(files: ReplicaFiles) -> None:
    """The job's, the attempt's and the replica's working directory: three mkdir calls where os.makedirs
    would also stat each parent (and pathlib would make a path of each)."""
    try:
        for folder in (files.job, files.attempt, files.work):
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o700)
    except FileNotFoundError:  # no jobs/ folder yet
        private_dir(files.work)


@dataclass(frozen=True)
class PidRecord:
    path: Path
    pid: int
    start: int | None
    node: str
    cgroup: str | None


def read_pid_files(data_dir: Path, job_id: str, attempt: int, node: str) -> list[PidRecord]:
    records = []
    folder = attempt_dir(data_dir, job_id, attempt)
    for path in sorted(folder.glob("replica-*.pid")) if folder.is_dir() else []:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if doc.get("node") == node:
            records.append(PidRecord(path, int(doc["pid"]), doc.get("start"), node, doc.get("cgroup")))
    return records
