"""Slurm's commands, run by the executor: `squeue`, `sinfo`, `sbatch`, `scancel`, with their machine-readable
output. They find the cluster as they always do (`SLURM_CONF` or /etc/slurm/slurm.conf, munge's socket)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Mapping, Sequence

from gpuyard.services.executor.slurm import cluster, queue
from gpuyard.services.executor.slurm.cluster import SlurmNode
from gpuyard.services.executor.slurm.queue import SlurmJob

TIMEOUT = 30.0
CLIENT_VARIABLES = ("SLURM_CONF",)
"""What Slurm's commands take from the executor's environment when they submit a job: where the cluster is, nothing
else (SLURM_* and SBATCH_* variables are options to sbatch, which a replica's environment must not set)."""


def slurm_client_env() -> dict[str, str]:
    return {name: os.environ[name] for name in CLIENT_VARIABLES if name in os.environ}


TRANSIENT = (
    "Requested node configuration is not available",  # (a controller just restarted: its node not back yet)
    "Unable to contact slurm controller",
    "temporarily unable to accept job",
    "Socket timed out",
    "Zero Bytes were transmitted or received",
    "Invalid node name specified",
)
"""Slurm's words for a refusal that is the cluster's state of the moment, not the job's: its controller away or
restarting, its node gone or not registered again (GPUYARD's scheduler placed the job where `sinfo` showed room)."""


class SlurmError(Exception):
    """A Slurm command failed; the message is its own (its standard error)."""

    @property
    def transient(self) -> bool:
        """Whether the cluster's state of the moment refused it (`TRANSIENT`), not what was asked."""
        return any(words in str(self) for words in TRANSIENT)


async def run(args: Sequence[str], stdin: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Standard output of a Slurm command; SlurmError when it fails, cannot be started or takes too long."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *args,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=None if env is None else dict(env),
        )
    except OSError as exc:
        raise SlurmError(f"{args[0]} could not be run: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(
            proc.communicate(stdin.encode() if stdin is not None else None), TIMEOUT
        )
    except TimeoutError as exc:
        proc.kill()
        await proc.wait()
        raise SlurmError(f"{args[0]} took more than {TIMEOUT:g}s") from exc
    if proc.returncode != 0:
        said = err.decode(errors="replace").strip() or out.decode(errors="replace").strip()
        raise SlurmError(f"{args[0]} failed ({proc.returncode}): {said}")
    return out.decode(errors="replace")


async def jobs() -> list[SlurmJob]:
    """Every job Slurm still lists, ended ones included (for `MinJobAge` after their end)."""
    return queue.parse_queue(await run(["squeue", "-h", "--states=all", "-O", queue.FORMAT]))


async def nodes(partition: str = "") -> dict[str, SlurmNode]:
    args = ["sinfo", "-N", "-h", "-O", cluster.FORMAT]
    return cluster.parse_nodes(await run([*args, f"--partition={partition}"] if partition else args))


async def sbatch(args: Sequence[str], script: str, env: Mapping[str, str]) -> str:
    """Submits a batch job with `env` as sbatch's whole environment (and so, with `--export=ALL`, the job's, besides
    Slurm's own variables); its Slurm job id."""
    out = await run(["sbatch", *args], stdin=script, env={**env, **slurm_client_env()})
    return out.strip().split(";")[0]


async def scancel_named(name: str) -> None:
    """Cancels the jobs of that name (a batch job whose `sbatch` gave no id, yet may have been taken)."""
    await run(["scancel", f"--name={name}"])


async def scancel(slurm_ids: Sequence[str], signal: str | None = None) -> None:
    """Cancels the jobs (Slurm's SIGTERM, then SIGKILL after its KillWait) or, with `signal`, sends it to every
    process of their batch step (`--full`) and leaves them running."""
    if not slurm_ids:
        return
    args = ["scancel", *([f"--signal={signal}", "--full"] if signal else []), *slurm_ids]
    await run(args)
