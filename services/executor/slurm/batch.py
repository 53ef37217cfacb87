"""One replica as a Slurm batch job: its `sbatch` arguments and its script. Pure.

- Pinned where GPUYARD's scheduler placed it: `--nodelist=<its node>`, one node, one task, the job's CPUs
  (`--cpus-per-task`, rounded up) and memory (`--mem`), and its GPUs as gres: `--gres=gpu:N` for whole GPUs
  (which devices is Slurm's choice, and Slurm sets CUDA_VISIBLE_DEVICES), `--gres=shard:K` for a fractional
  GPU (K: its fraction of the node's shards per GPU) where the node has shards and the setting allows,
  else a whole GPU. A replica without GPUs gets an empty CUDA_VISIBLE_DEVICES.
- `--no-requeue`: Slurm never reruns it by itself (GPUYARD's scheduler requeues, as a new attempt);
  `--time`: the job's timeout plus the grace and `time_margin`, a backstop (GPUYARD stops it at its timeout).
- Its environment is the one every backend gives (`jobenv.replica_env`: RANK, WORLD_SIZE, MASTER_ADDR, tokens):
  sbatch runs with it as its whole environment and `--export=ALL` (so nothing of the executor's own leaks; and
  not `--export=NONE`, with which Slurm loads the user's login environment on the node, a second or more per
  job), and the script exports it again (a site's job_submit plugin may filter sbatch's). Slurm keeps both in
  its state folder (root's).
- Its user: the tenant's (`GPUYARD_JOB_USERS`); a user with an account is given to Slurm (`--uid`, `--gid`:
  Slurm runs and accounts the job as that user); a derived uid without an account runs its command through
  `setpriv` (the job runs as root in Slurm's accounts); the platform's own user runs it as itself.
- The script writes the command's exit code to the replica's exit file before it ends, the witness of an end
  that Slurm no longer lists (after `MinJobAge`, or a controller restart) when a restarted executor looks.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from gpuyard.services.executor.slurm.cluster import SlurmNode
from gpuyard.services.executor.slurm.queue import job_name
from gpuyard.shared.contracts.events.jobs import ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.settings.slurm import SlurmConfig

MIB = 2**20


@dataclass(frozen=True)
class ReplicaFiles:
    """Where a replica's batch job writes, in the spool folder (which the compute nodes reach)."""

    output: str
    exit: str
    workdir: str


def spool_folder(config: SlurmConfig, data_dir: Path) -> Path:
    """The spool folder: `GPUYARD_SLURM_SPOOL_DIR`, by default `<data dir>/slurm` (`<job id>/attempt-<n>/` in
    it; the retention deletes a job's with its other folders)."""
    return Path(config.spool_dir) if config.spool_dir else Path(data_dir) / "slurm"


def spool_files(spool: str, job_id: str, attempt: int, replica: int) -> ReplicaFiles:
    folder = f"{spool}/{job_id}/attempt-{attempt}"
    return ReplicaFiles(
        f"{folder}/replica-{replica}.out", f"{folder}/replica-{replica}.exit", f"{folder}/work-{replica}"
    )


def gres(placement: ReplicaPlacement, node: SlurmNode | None, config: SlurmConfig) -> str:
    """The `--gres` of a replica's GPUs ("" for none)."""
    whole = sum(1 for g in placement.gpus if g.fraction >= 1)
    shared = [g for g in placement.gpus if g.fraction < 1]
    if shared and not whole:
        per = node.shards_per_gpu if node is not None else 0
        if config.fractions == "shard" and per:
            return f"shard:{max(1, min(per, round(shared[0].fraction * per)))}"
        return "gpu:1"
    return f"gpu:{whole + len(shared)}" if whole or shared else ""


def time_limit(spec: JobSpec, grace: float, config: SlurmConfig) -> str | None:
    """`--time` in minutes (None: the partition's own limit)."""
    if not spec.timeout:
        return None
    return str(max(1, math.ceil((spec.timeout + grace + config.time_margin) / 60)))


def sbatch_args(
    *,
    job_id: str,
    attempt: int,
    tenant: str,
    spec: JobSpec,
    placement: ReplicaPlacement,
    node: SlurmNode | None,
    files: ReplicaFiles,
    workdir: str,
    user: JobUser | None,
    user_has_account: bool,
    grace: float,
    config: SlurmConfig,
) -> list[str]:
    resources = spec.resources
    args = [
        "--parsable",
        f"--job-name={job_name(job_id, attempt, placement.replica)}",
        f"--comment=gpuyard tenant={tenant}",
        f"--nodelist={placement.node}",
        "--nodes=1",
        "--ntasks=1",
        f"--cpus-per-task={max(1, math.ceil(resources.cpus))}",
        f"--mem={max(1, math.ceil(resources.memory / MIB))}M",
        "--no-requeue",
        f"--output={files.output}",
        "--open-mode=append",
        f"--chdir={workdir}",
        "--export=ALL",
    ]
    if wanted := gres(placement, node, config):
        args.append(f"--gres={wanted}")
    if limit := time_limit(spec, grace, config):
        args.append(f"--time={limit}")
    for flag, value in (
        ("--partition", config.partition),
        ("--account", config.account),
        ("--qos", config.qos),
    ):
        if value:
            args.append(f"{flag}={value}")
    if user is not None and user_has_account:
        args += [f"--uid={user.uid}", f"--gid={user.gid}"]
    return [*args, *config.extra_args]


def command_line(spec: JobSpec) -> str:
    command = spec.command
    if command is None:
        raise ValueError("the job has no command")
    if isinstance(command, str):
        return f"/bin/sh -c {shlex.quote(command)}"
    return shlex.join(command)


def script(
    *,
    env: dict[str, str],
    spec: JobSpec,
    files: ReplicaFiles,
    user: JobUser | None,
    user_has_account: bool,
    title: str,
) -> str:
    """The batch script: the environment, the command (as the tenant's user), the exit file."""
    lines = ["#!/bin/sh", f"# {title}"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    run = command_line(spec)
    if user is not None and not user_has_account:
        run = f"setpriv --reuid={user.uid} --regid={user.gid} --clear-groups -- {run}"
    exit_file = shlex.quote(files.exit)
    lines += [
        run,
        "code=$?",
        f'echo "$code" > {exit_file}.part && mv -f {exit_file}.part {exit_file}',
        'exit "$code"',
    ]
    return "\n".join(lines) + "\n"
