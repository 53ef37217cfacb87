"""The environment a replica runs in: the job's own env, GPU pinning, and torchrun-style distributed vars.

Each replica also gets a publish token (GPUYARD_PUBLISH_TOKEN, `gpuyard.shared.auth.jobtokens`: its tenant, job and attempt,
for `POST /v1/models` only), a checkpoint token (GPUYARD_CHECKPOINT_TOKEN: the same, for reporting the job's own
checkpoints only, `POST /v1/jobs/{id}/checkpoints`) and the API's URL (GPUYARD_SERVER), so that
`gpuyard.publish_model` and `gpuyard.checkpoint` work inside the job with nothing typed; never the platform's own
credentials. The tokens are in that replica's environment only, which no other tenant can read, and are never
logged.

On the local backend each replica also gets its job's checkpoint and output folders (GPUYARD_CHECKPOINT_DIR,
GPUYARD_OUTPUT_DIR, `gpuyard.shared.runtime.paths.job_storage`), the same for every attempt of the job
(docs/storage.md).

`TMPDIR` is the replica's private temporary folder (`tmpdir`: `/tmp` where the replica has a /tmp of its own
in a mount namespace, else a folder of its attempt's, 0700 and its user's), never the executor's own, which
other tenants' jobs may share; a `TMPDIR` in the job's `env` wins.

A fractional GPU adds its memory share (GPUYARD_GPU_MEMORY_FRACTION, GPUYARD_GPU_MEMORY_BYTES), which the
`gpuyard.training` helper applies to PyTorch; where the node runs CUDA MPS, also the MPS client limits
CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, which the MPS server enforces.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuyard.shared.auth.devtoken import dev_env
from gpuyard.shared.auth.jobtokens import (
    CHECKPOINT_SCOPE,
    PUBLISH_SCOPE,
    JobTokenError,
    read_secret,
    secret_path,
    sign,
)
from gpuyard.shared.contracts.events.jobs import JobPlaced, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.runtime.installhint import install_command
from gpuyard.shared.runtime.paths import JobStorage

log = logging.getLogger(__name__)

# Variables from the executor's own environment that jobs inherit; everything else is the job's.
INHERITED = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "USER",
    "LOGNAME",
    "SHELL",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
)
DEFAULT_MPS_PIPE_DIRECTORY = "/tmp/nvidia-mps"


def platform_path(inherited_path: str | None) -> dict[str, str]:
    """The platform's own Python environment first on the PATH, so that a job's `python`, `torchrun` or
    `gpuyard` are the ones installed with GPUYARD (where `pip install -e '.[train]'` put PyTorch), whatever the
    PATH of the shell that started `gpuyard up`; and VIRTUAL_ENV naming it when it is one."""
    scripts = str(Path(sys.executable).parent)  # not resolved: a venv's python is a link out of the venv
    rest = [p for p in (inherited_path or os.defpath).split(os.pathsep) if p and p != scripts]
    env = {"PATH": os.pathsep.join([scripts, *rest])}
    if sys.prefix != sys.base_prefix:
        env["VIRTUAL_ENV"] = sys.prefix
    return env


def environment_path(venv: str, inherited_path: str | None) -> dict[str, str]:
    """A job with an environment of its own (`environment:`, docs/environments.md): its environment's bin first
    on the PATH and VIRTUAL_ENV naming it; the platform's own Python left out of its PATH."""
    scripts, platform = f"{venv}/bin", str(Path(sys.executable).parent)
    rest = [p for p in (inherited_path or os.defpath).split(os.pathsep) if p and p not in (scripts, platform)]
    return {"PATH": os.pathsep.join([scripts, *rest]), "VIRTUAL_ENV": venv}


def mps_running(environ: Mapping[str, str] | None = None) -> bool:
    """Whether an MPS control daemon (nvidia-cuda-mps-control -d) serves this node: its pipe exists."""
    env = os.environ if environ is None else environ
    pipe_dir = Path(env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_MPS_PIPE_DIRECTORY)
    return (pipe_dir / "control").exists()


def mps_env(fraction: float, memory_bytes: int | None) -> dict[str, str]:
    """MPS client limits of a share: its part of the SMs and its pinned memory on device 0 (the only one
    the replica sees)."""
    env = {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, min(100, math.ceil(fraction * 100))))}
    if memory_bytes:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={max(1, memory_bytes // 2**20)}M"
    return env


@dataclass(frozen=True)
class Publishing:
    """What a replica's publish token is made with."""

    secret: bytes
    api_url: str
    lifetime: float

    def __repr__(self) -> str:  # never the secret
        return f"Publishing(api_url={self.api_url!r}, lifetime={self.lifetime:g}, secret=***)"


_publishing: Publishing | None = None


def configure_publishing(publishing: Publishing | None) -> None:
    """Set what replicas' publish tokens are made with (None, as before any call: they get none); the
    executor's `main` does it at its start, from its settings."""
    global _publishing
    _publishing = publishing


def publishing_from_settings(settings) -> Publishing | None:
    """An executor's `Publishing` from its settings; None (said once, never the secret) without a secret."""
    path = secret_path(settings.data_dir, settings.publish_secret_file)
    try:
        secret = read_secret(path)
    except JobTokenError as exc:
        log.warning("jobs get no publish token (gpuyard.publish_model will not work in them): %s", exc)
        return None
    return Publishing(secret, settings.api_url.rstrip("/"), settings.publish_token_lifetime)


def publish_env(*, job_id: str, tenant: str, attempt: int) -> dict[str, str]:
    """GPUYARD_PUBLISH_TOKEN (for this job's attempt and tenant, `models:publish` only),
    GPUYARD_CHECKPOINT_TOKEN (the same, `jobs:checkpoint` only) and GPUYARD_SERVER; nothing when the platform
    gives no job tokens."""
    publishing = _publishing
    if publishing is None:
        return {}
    secret, lifetime = publishing.secret, publishing.lifetime
    token = {
        scope: sign(secret, tenant=tenant, job_id=job_id, attempt=attempt, lifetime=lifetime, scope=scope)
        for scope in (PUBLISH_SCOPE, CHECKPOINT_SCOPE)
    }
    return {
        "GPUYARD_PUBLISH_TOKEN": token[PUBLISH_SCOPE],
        "GPUYARD_CHECKPOINT_TOKEN": token[CHECKPOINT_SCOPE],
        "GPUYARD_SERVER": publishing.api_url,
    }


def notebook_env(spec: JobSpec, job_id: str, attempt: int) -> dict[str, str]:
    """A dev environment's notebook token and port (`devtoken`, JUPYTER_TOKEN and GPUYARD_DEV_PORT), and the
    command that installs JupyterLab for this node's GPUYARD (said where it is missing); nothing for another
    job, or when the platform gives no job tokens (its start then says so in one line)."""
    if spec.dev is None or _publishing is None:
        return {}
    return {**dev_env(_publishing.secret, job_id, attempt), "GPUYARD_DEV_INSTALL": install_command("dev")}


def storage_env(storage: JobStorage) -> dict[str, str]:
    """The job's checkpoint and output folders, which every attempt of it shares."""
    return {"GPUYARD_CHECKPOINT_DIR": storage.checkpoints, "GPUYARD_OUTPUT_DIR": storage.outputs}


def identity_env(
    *, job_id: str, job_name: str, tenant: str, attempt: int, replica: int, node: str
) -> dict[str, str]:
    """Which job, attempt and replica this process is, and its publish token: the same names on every
    backend."""
    return {
        "GPUYARD_JOB_ID": job_id,
        "GPUYARD_JOB_NAME": job_name,
        "GPUYARD_TENANT": tenant,
        "GPUYARD_ATTEMPT": str(attempt),
        "GPUYARD_REPLICA": str(replica),
        "GPUYARD_NODE": node,
        **publish_env(job_id=job_id, tenant=tenant, attempt=attempt),
    }


def torchrun_env(
    *, rank: int, world_size: int, local_rank: int, local_world_size: int, master_addr: str, master_port: int
) -> dict[str, str]:
    """What `torchrun` sets, so that torch.distributed code written for it runs unchanged."""
    return {
        "WORLD_SIZE": str(world_size),
        "RANK": str(rank),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }


def replica_env(
    *,
    job_id: str,
    job_name: str,
    tenant: str,
    spec: JobSpec,
    placed: JobPlaced,
    replica: ReplicaPlacement,
    master_addr: str,
    master_port: int,
    simulated: bool,
    gpu_memory: dict[int, int] | None = None,
    mps: bool = False,
    tmpdir: str | None = None,
    storage: JobStorage | None = None,
    venv: str | None = None,
) -> dict[str, str]:
    """`gpu_memory`: the node's GPU index → total bytes (to size a slice given only as a fraction);
    `mps`: the node runs CUDA MPS; `tmpdir`: the replica's private temporary folder (None: the executor's
    TMPDIR, if any); `storage`: the job's checkpoint and output folders (None: none on this backend); `venv`:
    the job's own environment, built on the node (None: the platform's Python)."""
    env = {k: os.environ[k] for k in INHERITED if k in os.environ}
    if venv is None:
        env.update(platform_path(env.get("PATH")))
    else:  # (nor the platform's PYTHONPATH: its packages are not the job's)
        env.pop("PYTHONPATH", None)
        env.update(environment_path(venv, env.get("PATH")))
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    env.update(spec.env)
    on_node = sorted(p.replica for p in placed.placements if p.node == replica.node)
    gpus = replica.gpus
    visible = ",".join(str(g.index) if simulated or not g.uuid else g.uuid for g in gpus)
    env.update(
        identity_env(
            job_id=job_id,
            job_name=job_name,
            tenant=tenant,
            attempt=placed.attempt,
            replica=replica.replica,
            node=replica.node,
        )
    )
    env.update(notebook_env(spec, job_id, placed.attempt))
    if storage is not None:
        env.update(storage_env(storage))
    env["GPUYARD_GPUS"] = ",".join(str(g.index) for g in gpus)
    env["CUDA_VISIBLE_DEVICES"] = visible
    env.update(
        torchrun_env(
            rank=replica.replica,
            world_size=len(placed.placements),
            local_rank=on_node.index(replica.replica),
            local_world_size=len(on_node),
            master_addr=master_addr,
            master_port=master_port,
        )
    )
    if simulated:
        env["GPUYARD_SIMULATED_GPUS"] = "1"
    shared = [g for g in gpus if g.fraction < 1]
    if shared:
        share = shared[0]
        slice_bytes = share_bytes(share.fraction, share.memory_bytes, (gpu_memory or {}).get(share.index))
        env["GPUYARD_GPU_MEMORY_FRACTION"] = f"{share.fraction:g}"
        if slice_bytes:
            env["GPUYARD_GPU_MEMORY_BYTES"] = str(slice_bytes)
        if mps:
            env.update(mps_env(share.fraction, slice_bytes))
    return env


def share_bytes(fraction: float, memory_bytes: int | None, total: int | None) -> int | None:
    """A shared GPU's memory slice: the one placed, else its fraction of the GPU's memory when known."""
    if memory_bytes:
        return memory_bytes
    return int(fraction * total) if total else None
