"""Slurm's job queue as the backend reads it: `squeue --states=all` with machine-readable fields, parsed.

One reading gives both what the backend watches (its own batch jobs, named by `job_name`: the GPUYARD job, the
attempt and the replica) and what it must leave alone (the GPUs that jobs submitted outside GPUYARD hold).
`squeue --json` says the same in 22.05, but loads Slurm's OpenAPI plugins at each call (0.6 s against 25 ms
here): the backend reads it every second, so it reads the `--Format` fields instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIELDS = ("JobID", "Name", "State", "exit_code", "Reason", "NodeList", "tres-per-node", "UserName", "Comment")
WIDTH = 0
SEPARATOR = "|"
FORMAT = ",".join(f"{name}:{WIDTH}{SEPARATOR}" for name in FIELDS)
"""squeue's `-O` argument: each field whole (width 0: neither padded nor cut short) and ended by `|`."""
NAME = re.compile(r"^gy-(?P<job>.+)-a(?P<attempt>\d+)-r(?P<replica>\d+)$")
ACTIVE = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING"})
RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED"})


def job_name(job_id: str, attempt: int, replica: int) -> str:
    """The Slurm job name of one replica's batch job: what finds it again after a restart."""
    return f"gy-{job_id}-a{attempt}-r{replica}"


@dataclass(frozen=True)
class SlurmJob:
    slurm_id: str
    name: str
    state: str
    """Slurm's job state: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, ..."""
    status: int
    """The batch script's wait status (exit code << 8, or the signal)."""
    reason: str
    nodes: str
    tres_per_node: str
    user: str = ""
    comment: str = ""

    @property
    def replica_key(self) -> tuple[str, int, int] | None:
        """(GPUYARD job, attempt, replica) of one of GPUYARD's batch jobs; None for any other job."""
        found = NAME.match(self.name)
        if found is None:
            return None
        return found["job"], int(found["attempt"]), int(found["replica"])

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def running(self) -> bool:
        return self.state in RUNNING


def parse_queue(text: str) -> list[SlurmJob]:
    """The jobs of `squeue -h --states=all -O FORMAT`'s output (lines it cannot read are left out)."""
    jobs = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(SEPARATOR)]
        if len(parts) < len(FIELDS):
            continue
        slurm_id, name, state, status, reason, nodes, tres, user, comment = parts[: len(FIELDS)]
        try:
            code = int(status)
        except ValueError:
            code = 0
        jobs.append(
            SlurmJob(
                slurm_id=slurm_id,
                name=name,
                state=state.split()[0] if state else "",
                status=code,
                reason=reason,
                nodes="" if nodes == "(null)" else nodes,
                tres_per_node="" if tres in ("(null)", "N/A") else tres,
                user=user,
                comment="" if comment == "(null)" else comment,
            )
        )
    return jobs


def gres_count(tres: str, name: str) -> int:
    """How many of gres `name` a job's tres-per-node asks for: "gres:gpu:2" → 2, "gres/gpu=2", "gres:gpu:a100:1"."""
    total = 0
    for item in re.split(r",(?=gres)", tres):
        found = re.match(rf"^gres[:/]{re.escape(name)}(?:[:=](?:[^:=,]+[:=])?(\d+))?$", item.strip())
        if found:
            total += int(found[1]) if found[1] else 1
    return total


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compact host list as names: "gpu[01-03,07],login1" → gpu01, gpu02, gpu03, gpu07, login1."""
    names: list[str] = []
    for prefix, ranges, plain in re.findall(r"([^,\[]+)\[([^\]]+)\]|([^,\[\]]+)", hostlist):
        if plain:
            names.append(plain)
            continue
        for part in ranges.split(","):
            low, _, high = part.partition("-")
            if not high:
                names.append(prefix + low)
                continue
            width = len(low)
            names.extend(f"{prefix}{n:0{width}d}" for n in range(int(low), int(high) + 1))
    return names
