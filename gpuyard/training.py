"""Helpers for training code that runs under GPUYARD. PyTorch is imported only when needed: it is not a core
dependency of GPUYARD (`pip install 'gpuyard[train]'` adds it).

    from gpuyard.training import apply_gpu_memory_limit, init_distributed

    apply_gpu_memory_limit()   # a fractional GPU: keep PyTorch inside the job's memory slice
    init_distributed()         # torchrun-style env (RANK, WORLD_SIZE, MASTER_ADDR…) → process group

The executor sets, for a job on a fraction of a GPU, GPUYARD_GPU_MEMORY_FRACTION (0 < f < 1) and, when the
slice's size is known, GPUYARD_GPU_MEMORY_BYTES. Other frameworks: see docs/executor.md.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

FRACTION = "GPUYARD_GPU_MEMORY_FRACTION"
BYTES = "GPUYARD_GPU_MEMORY_BYTES"


@dataclass(frozen=True)
class GpuMemoryShare:
    fraction: float | None
    """Share of the GPU's memory, None for a whole GPU."""
    bytes: int | None
    """Size of the slice, when known."""

    def fraction_of(self, total_bytes: int) -> float | None:
        """The fraction to give PyTorch on a GPU of `total_bytes`: the smaller of the share and the slice."""
        candidates = [f for f in (self.fraction,) if f is not None]
        if self.bytes and total_bytes > 0:
            candidates.append(self.bytes / total_bytes)
        return min(1.0, *candidates) if candidates else None


def gpu_memory_share(environ: Mapping[str, str] | None = None) -> GpuMemoryShare:
    """The job's GPU memory share from its environment. Raises ValueError, naming the variable, on bad values."""
    environ = os.environ if environ is None else environ
    fraction = nbytes = None
    if environ.get(FRACTION):
        try:
            fraction = float(environ[FRACTION])
        except ValueError:
            raise ValueError(f"{FRACTION}={environ[FRACTION]!r} is not a number") from None
        if not 0 < fraction <= 1:
            raise ValueError(f"{FRACTION}={environ[FRACTION]!r} must be in (0, 1]")
    if environ.get(BYTES):
        try:
            nbytes = int(environ[BYTES])
        except ValueError:
            raise ValueError(f"{BYTES}={environ[BYTES]!r} is not a whole number of bytes") from None
        if nbytes <= 0:
            raise ValueError(f"{BYTES}={environ[BYTES]!r} must be positive")
    return GpuMemoryShare(fraction, nbytes)


def apply_gpu_memory_limit(device=None, environ: Mapping[str, str] | None = None) -> float | None:
    """Cap PyTorch's CUDA caching allocator in this process at the job's memory slice
    (`torch.cuda.set_per_process_memory_fraction`). Returns the fraction set; None when there is nothing to
    do (a whole GPU, or no CUDA). An allocation beyond the cap raises torch's out-of-memory error in the job
    instead of taking memory from the jobs sharing the GPU."""
    share = gpu_memory_share(environ)
    if share.fraction is None and share.bytes is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    fraction = share.fraction_of(torch.cuda.get_device_properties(device).total_memory)
    if fraction is None:
        return None
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


@dataclass(frozen=True)
class DistributedEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int


def distributed_env(environ: Mapping[str, str] | None = None) -> DistributedEnv:
    """The torchrun-style variables every replica gets (one replica alone: rank 0 of 1)."""
    environ = os.environ if environ is None else environ
    try:
        return DistributedEnv(
            rank=int(environ.get("RANK", 0)),
            world_size=int(environ.get("WORLD_SIZE", 1)),
            local_rank=int(environ.get("LOCAL_RANK", 0)),
            local_world_size=int(environ.get("LOCAL_WORLD_SIZE", 1)),
            master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
            master_port=int(environ.get("MASTER_PORT", 29500)),
        )
    except ValueError as exc:
        raise ValueError(f"a torchrun variable is not a number: {exc}") from None


def init_distributed(backend: str | None = None, environ: Mapping[str, str] | None = None):
    """`torch.distributed.init_process_group` from the environment: NCCL when this replica sees a GPU, gloo
    otherwise. Returns the DistributedEnv."""
    import torch
    import torch.distributed as dist

    env = distributed_env(environ)
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank % max(1, torch.cuda.device_count()))
    dist.init_process_group(
        backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
    )
    return env
