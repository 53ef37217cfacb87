"""A real one-node Slurm cluster for the tests and the benchmark: munged (as the `munge` user, on a socket of its
own), slurmctld and slurmd started from a configuration generated in a temporary folder, with fake GPUs
(character devices made with `mknod`, gres.conf `AutoDetect=off`) and shards of them.

`SlurmCluster.start()` raises `Unavailable` with the reason when Slurm cannot run here (not installed, not root,
a daemon that does not come up): the tests skip with it, never silently.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

GPUS = 4
SHARDS_PER_GPU = 4
CPUS = 32
MEMORY_MIB = 16000
READY = ("idle", "mixed", "allocated")
"""The node's states in which it runs jobs (`sinfo`'s words)."""
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scancel", "scontrol")


class Unavailable(Exception):
    """Slurm cannot run here; the message says why."""


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def cgroup_plugin() -> str:
    """cgroup/v2 on a pure cgroup v2 host, else v1 (Slurm 22.05 refuses the hybrid layout under v2)."""
    return "cgroup/v2" if Path("/sys/fs/cgroup/cgroup.controllers").exists() else "cgroup/v1"


class SlurmCluster:
    def __init__(self, folder: Path | None = None):
        self.folder = Path(folder or tempfile.mkdtemp(prefix="gpuyard-slurm-"))
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.folder / "slurm.conf"
        self.procs: list[subprocess.Popen] = []
        self.munge_pid: int | None = None

    @property
    def env(self) -> dict[str, str]:
        """What Slurm's commands need to find this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            timeout=30,
            check=check,
        )

    def start(self) -> SlurmCluster:
        missing = [b for b in BINARIES if shutil.which(b) is None]
        if missing:
            raise Unavailable(
                f"Slurm is not installed ({', '.join(missing)} missing: apt-get install slurm-wlm munge)"
            )
        if os.geteuid() != 0:
            raise Unavailable("starting slurmd and munged needs root")
        try:
            pwd.getpwnam("munge")
        except KeyError as exc:
            raise Unavailable("no `munge` user (apt-get install munge)") from exc
        try:
            self._munge()
            self._configure()
            self._daemons()
        except BaseException:
            self.stop()
            raise
        return self

    def _munge(self) -> None:
        folder = self.folder / "munge"
        folder.mkdir(parents=True)
        self.folder.chmod(0o755)
        key = folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        munge = pwd.getpwnam("munge")
        for path in (folder, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        key.chmod(0o400)
        folder.chmod(0o755)
        self.munge_socket = folder / "munge.sock"
        started = subprocess.run(
            [
                "runuser", "-u", "munge", "--", "munged",
                f"--socket={self.munge_socket}", f"--key-file={key}", f"--pid-file={folder}/munged.pid",
                f"--log-file={folder}/munged.log", f"--seed-file={folder}/munged.seed",
            ],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        if started.returncode != 0:
            raise Unavailable(f"munged did not start: {started.stderr.strip() or started.stdout.strip()}")
        self.munge_pid = int((folder / "munged.pid").read_text())

    def _configure(self) -> None:
        f = self.folder
        for name in ("state", "spool", "log", "dev"):
            (f / name).mkdir(exist_ok=True)
        for i in range(GPUS):
            os.mknod(f / "dev" / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))
        ctld, slurmd = free_ports(2)
        devices = f"{f}/dev/nvidia[0-{GPUS - 1}]"
        self.conf.write_text(
            "\n".join(
                [
                    "ClusterName=gpuyardtest",
                    f"SlurmctldHost={self.node}(127.0.0.1)",
                    f"SlurmctldPort={ctld}",
                    f"SlurmdPort={slurmd}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={f}/state",
                    f"SlurmdSpoolDir={f}/spool",
                    f"SlurmctldPidFile={f}/slurmctld.pid",
                    f"SlurmdPidFile={f}/slurmd.pid",
                    f"SlurmctldLogFile={f}/log/slurmctld.log",
                    f"SlurmdLogFile={f}/log/slurmd.log",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_Core_Memory",
                    "GresTypes=gpu,shard",
                    "ReturnToService=1",  # (a node set DOWN by hand stays down until resumed)
                    "MpiDefault=none",
                    "SchedulerType=sched/backfill",
                    "SchedulerParameters=sched_interval=1",
                    "MinJobAge=300",
                    "DefMemPerCPU=100",
                    # (memory enforced as a cluster without cgroups can: polled, the job killed past its --mem)
                    "JobAcctGatherType=jobacct_gather/linux",
                    "JobAcctGatherParams=OverMemoryKill",
                    "JobAcctGatherFrequency=task=1",
                    "AccountingStorageType=accounting_storage/none",
                    "JobCompType=jobcomp/none",
                    "SlurmdParameters=config_overrides",
                    "SlurmdTimeout=30",
                    "KillWait=2",
                    "InactiveLimit=0",
                    f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={CPUS} RealMemory={MEMORY_MIB} "
                    f"Gres=gpu:{GPUS},shard:{GPUS * SHARDS_PER_GPU} State=UNKNOWN",
                    f"PartitionName=gpu Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
                    "",
                ]
            )
        )
        shards = [
            f"NodeName={self.node} Name=shard Count={SHARDS_PER_GPU} File={f}/dev/nvidia{i}"
            for i in range(GPUS)
        ]
        (f / "gres.conf").write_text(
            "\n".join(["AutoDetect=off", f"NodeName={self.node} Name=gpu File={devices}", *shards, ""])
        )
        (f / "cgroup.conf").write_text(f"CgroupPlugin={cgroup_plugin()}\nIgnoreSystemd=yes\n")

    def _daemon(self, daemon: str) -> subprocess.Popen:
        out = (self.folder / "log" / f"{daemon}.out").open("ab")
        return subprocess.Popen(
            [daemon, "-D", "-f", str(self.conf)],
            env={**os.environ, **self.env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )

    def _daemons(self) -> None:
        self.procs += [self._daemon("slurmctld"), self._daemon("slurmd")]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise Unavailable(f"{proc.args[0]} exited: {self.log_tail(proc.args[0])}")
            if self.node_state() in READY:
                return
            time.sleep(0.2)
        raise Unavailable(
            f"the Slurm node did not become idle: {self.node_state()!r}; {self.log_tail('slurmd')}"
        )

    def restart_controller(self) -> int:
        """Stops slurmctld (SIGTERM: it saves its state) and starts it again from its state folder, as a service
        manager restarts it; the pid stopped. The jobs it placed run on under slurmd meanwhile, and Slurm's
        commands fail until it is back."""
        old = self.procs[0]
        old.terminate()
        old.wait(30)
        self.procs[0] = self._daemon("slurmctld")
        return old.pid

    def controller_back(self, stopped: int) -> bool:
        """Whether a new slurmctld (not `stopped`) runs and answers for its node."""
        ctld = self.procs[0]
        return ctld.pid != stopped and ctld.poll() is None and self.node_state().startswith(READY)

    def log_tail(self, daemon: str) -> str:
        with contextlib.suppress(OSError):
            return (self.folder / "log" / f"{daemon}.log").read_text()[-1500:]
        return ""

    def node_state(self) -> str:
        done = self.run("sinfo", "-h", "-N", "-o", "%T", check=False)
        return done.stdout.strip().split("\n")[0] if done.returncode == 0 else ""

    def sbatch(self, *args: str) -> str:
        """Submits a job by hand (outside GPUYARD); its Slurm job id."""
        return self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]

    def scontrol(self, *args: str) -> None:
        self.run("scontrol", *args)

    def cancel_all(self) -> None:
        self.run("scancel", "--user=root", check=False)

    def stop(self) -> None:
        if self.procs and all(proc.poll() is None for proc in self.procs):
            self.cancel_all()
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        self.procs.clear()
        if self.munge_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.munge_pid, signal.SIGTERM)
            deadline = time.monotonic() + 10
            while Path(f"/proc/{self.munge_pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.05)  # (it writes its log and seed file as it ends)
            self.munge_pid = None
        shutil.rmtree(self.folder, ignore_errors=True)
