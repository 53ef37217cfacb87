"""What still runs on this node of attempts that moved on while no executor of the node watched them: a node
cut off from the bus (its executor killed, its machine unreachable) is declared lost, and its attempts are
requeued and placed elsewhere or ended, while their replicas, in sessions of their own under their reapers,
may still run here. When the node's executor comes back, `running_attempts` finds them (the pid files of this
node's replicas whose processes still run) and the local backend stops those the job no longer wants here
(`LocalBackend.stop_leftovers`): a requeued gang never runs twice, once here and once elsewhere."""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuyard.services.executor.exits import AttemptKey
from gpuyard.services.executor.pidfiles import PidRecord, read_pid_files
from gpuyard.services.executor.processes import process_start_time

ATTEMPT = re.compile(r"attempt-(\d+)")


def attempts_with_pid_files(data_dir: Path) -> list[AttemptKey]:
    """Every attempt of which a replica's pid file is left in the data dir (`jobs/<job>/attempt-<n>/`): a pid
    file is removed once its replica's end is recorded, so these are the attempts not known to have ended."""
    found = []
    jobs = Path(data_dir) / "jobs"
    try:
        job_dirs = [entry for entry in os.scandir(jobs) if entry.is_dir()]
    except OSError:
        return []
    for job in job_dirs:
        try:
            attempts = [entry for entry in os.scandir(job.path) if entry.is_dir()]
        except OSError:
            continue
        for attempt in attempts:
            match = ATTEMPT.fullmatch(attempt.name)
            if match and any(n.endswith(".pid") for n in _names(attempt.path)):
                found.append(AttemptKey(job.name, int(match.group(1))))
    return found


def _names(folder: str) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def running_attempts(data_dir: Path, node: str) -> dict[AttemptKey, list[PidRecord]]:
    """The attempts of which a replica of `node` still runs (its first process, by pid and start time), with
    the pid records of that node's replicas."""
    running: dict[AttemptKey, list[PidRecord]] = {}
    for key in attempts_with_pid_files(data_dir):
        records = read_pid_files(data_dir, key.job_id, key.attempt, node)
        if any(r.start is not None and process_start_time(r.pid) == r.start for r in records):
            running[key] = records
    return running
