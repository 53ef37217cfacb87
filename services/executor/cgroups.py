"""CPU and memory limits of local replicas through cgroup v2, where the executor may write its cgroups.

The executor needs a delegated subtree: a cgroup v2 directory it may write (systemd `Delegate=yes`, a
container with a private writable cgroup namespace, or root). By default that is the executor's own cgroup
(read from /proc/self/cgroup); `GPUYARD_CGROUP_PARENT` names another one under the mount point. Because
cgroup v2 allows no processes in a cgroup that distributes controllers to children, the executor first moves
the processes of its own cgroup into a leaf `executor/` beside the jobs.

Each replica gets `gpuyard-<job>-a<attempt>-r<replica>/` with `cpu.max` (its cpus, as quota per 100 ms) and
`memory.max` (its memory; swap off where `memory.swap.max` exists, `memory.oom.group` on, so an out-of-memory
kill takes the whole replica). The replica's first process puts itself into that cgroup before it `exec`s
the job's command, so every process of the job is inside from the start. After it ends, `memory.events`
tells whether the kernel killed it for exceeding its limit.

Where any of this is impossible (cgroup v1, read-only /sys/fs/cgroup, controllers missing), `status` says
why in plain words and jobs run without limits: "not enforced on this node: …".
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from gpuyard.services.executor.nodelog import node_log

log = logging.getLogger(__name__)
NEEDED = ("cpu", "memory")
CPU_PERIOD_US = 100_000
ENTER_FAILED = "gpuyard: cannot enter the cgroup"


@dataclass(frozen=True)
class LimitStatus:
    enforced: bool
    message: str


def own_cgroup(proc_self_cgroup: Path = Path("/proc/self/cgroup")) -> str | None:
    """The executor's cgroup v2 path ("0::/path"), None without a unified hierarchy."""
    try:
        for line in proc_self_cgroup.read_text().splitlines():
            if line.startswith("0::"):
                return line[3:].strip() or "/"
    except OSError:
        return None
    return None


class Cgroups:
    def __init__(self, root: Path, parent: str | None, *, enabled: bool = True, own: str | None = None):
        self.root = root
        self.requested_parent = parent
        self.enabled = enabled
        self.own = own
        self.parent: Path | None = None
        self.status = LimitStatus(False, "not enforced on this node: cgroups not set up yet")

    def setup(self) -> LimitStatus:
        """Prepare the parent cgroup; never raises. The status says whether limits are enforced and why not."""
        try:
            self.status = self._setup()
        except OSError as exc:
            self.status = LimitStatus(
                False,
                f"not enforced on this node: cannot prepare cgroup {self.parent}: {exc.strerror or exc}",
            )
        level = logging.INFO if self.status.enforced else logging.WARNING
        node_log.log(level, "cpu and memory limits: %s", self.status.message)
        return self.status

    def _setup(self) -> LimitStatus:
        if not self.enabled:
            return LimitStatus(False, "not enforced on this node: disabled by GPUYARD_CGROUP_LIMITS=false")
        if not (self.root / "cgroup.controllers").exists():
            return LimitStatus(
                False,
                f"not enforced on this node: {self.root} is not a cgroup v2 hierarchy (cgroup v1 or none)",
            )
        relative = self.requested_parent or self.own or own_cgroup()
        if relative is None:
            return LimitStatus(
                False, "not enforced on this node: the executor is not in a cgroup v2 hierarchy"
            )
        parent = self.root / relative.strip("/")
        self.parent = parent
        if not parent.is_dir():
            return LimitStatus(False, f"not enforced on this node: cgroup {parent} does not exist")
        available = (parent / "cgroup.controllers").read_text().split()
        missing = [c for c in NEEDED if c not in available]
        if missing:
            return LimitStatus(
                False,
                f"not enforced on this node: cgroup {parent} lacks the {' and '.join(missing)} controller(s)",
            )
        if not os.access(parent, os.W_OK) or not os.access(parent / "cgroup.subtree_control", os.W_OK):
            return LimitStatus(
                False,
                f"not enforced on this node: cgroup {parent} is not writable by the executor "
                "(delegate it, e.g. systemd Delegate=yes, or set GPUYARD_CGROUP_PARENT)",
            )
        self._vacate(parent)
        enabled = (parent / "cgroup.subtree_control").read_text().split()
        wanted = [c for c in NEEDED if c not in enabled]
        if wanted:
            (parent / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in wanted))
        return LimitStatus(True, f"enforced through cgroup v2 under {parent}")

    def _vacate(self, parent: Path) -> None:
        """Move the processes of `parent` into the leaf `executor/` (no internal processes in cgroup v2)."""
        procs = [p for p in (parent / "cgroup.procs").read_text().split() if p.strip()]
        if not procs:
            return
        leaf = parent / "executor"
        leaf.mkdir(exist_ok=True)
        for pid in procs:
            with contextlib.suppress(OSError):  # a process that ended meanwhile, or a kernel thread
                (leaf / "cgroup.procs").write_text(pid)

    # ------------------------------------------------------------------ per replica

    def name(self, job_id: str, attempt: int, replica: int) -> str:
        return f"gpuyard-{job_id}-a{attempt}-r{replica}"

    def create(self, job_id: str, attempt: int, replica: int, cpus: float, memory_bytes: int) -> Path | None:
        """The replica's cgroup with its limits, or None when limits are not enforced here."""
        if not self.status.enforced or self.parent is None:
            return None
        path = self.parent / self.name(job_id, attempt, replica)
        path.mkdir(exist_ok=True)
        if cpus > 0:
            quota = max(1000, int(round(cpus * CPU_PERIOD_US)))
            (path / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
        if memory_bytes > 0:
            (path / "memory.max").write_text(str(memory_bytes))
            for name, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (path / name).exists():
                    with contextlib.suppress(OSError):
                        (path / name).write_text(value)
        return path

    @staticmethod
    def oom_killed(cgroup: Path | None) -> bool:
        """Whether the kernel killed a process of this cgroup for exceeding memory.max."""
        if cgroup is None:
            return False
        try:
            for line in (cgroup / "memory.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value or 0) > 0:
                    return True
        except (OSError, ValueError):
            return False
        return False

    @staticmethod
    def kill(cgroup: Path | None) -> None:
        """SIGKILL to every process left in the cgroup (kernels ≥ 5.14 have cgroup.kill)."""
        if cgroup is not None and (cgroup / "cgroup.kill").exists():
            with contextlib.suppress(OSError):
                (cgroup / "cgroup.kill").write_text("1")

    @staticmethod
    def remove(cgroup: Path | None) -> None:
        if cgroup is not None:
            with contextlib.suppress(OSError):
                cgroup.rmdir()
