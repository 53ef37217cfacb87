"""Slurm's commands, run by the executor: `squeue`, `sinfo`, `sbatch`, `scancel`, with their machine-readable
output. They find the cluster as they always do (`SLURM_CONF` or /etc/slurm/slurm.conf, munge's socket)."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

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


COMMANDS_AT_ONCE = 16
"""Slurm commands running at once (a burst of placements submits its batch jobs side by side, up to this many)."""
_runner = ThreadPoolExecutor(max_workers=COMMANDS_AT_ONCE, thread_name_prefix="slurm-command")


async def run(args: Sequence[str], stdin: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Standard output of a Slurm command; SlurmError when it fails, cannot be started or takes too long.

    It runs in a thread of its own (`COMMANDS_AT_ONCE`), not through asyncio's subprocesses: starting a process
    from the executor's event loop holds the loop until the child has been forked and has run `exec` (a few ms
    each, many more on a busy machine), and a burst of `sbatch` calls would hold up everything else the
    executor does (the ends it reports, the events it writes) for as long."""
    return await asyncio.get_running_loop().run_in_executor(_runner, _run, list(args), stdin, env)


def _run(args: list[str], stdin: str | None, env: Mapping[str, str] | None) -> str:
    try:
        done = subprocess.run(
            args,
            input=stdin.encode() if stdin is not None else None,
            stdin=subprocess.DEVNULL if stdin is None else None,
            capture_output=True,
            env=None if env is None else dict(env),
            timeout=TIMEOUT,
        )
    except OSError as exc:
        raise SlurmError(f"{args[0]} could not be run: {exc}") from exc
    except subprocess.TimeoutExpired as exc:  # (killed by subprocess.run)
        raise SlurmError(f"{args[0]} took more than {TIMEOUT:g}s") from exc
    if done.returncode != 0:
        said = done.stderr.decode(errors="replace").strip() or done.stdout.decode(errors="replace").strip()
        raise SlurmError(f"{args[0]} failed ({done.returncode}): {said}")
    return done.stdout.decode(errors="replace")


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
