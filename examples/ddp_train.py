"""Distributed data-parallel training of a small model, written for torchrun's environment.

Run by GPUYARD (examples/ddp-cpu.yaml: 2 CPU workers, gloo), by torchrun
(`torchrun --nproc-per-node 2 examples/ddp_train.py`), or alone (one worker). Nothing in it is GPUYARD-specific
except the optional memory-slice helper: the executor sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT as torchrun does.

Each worker fits y = 3·x₀ − 2·x₁ + 0.5 on its own shard of synthetic data; DistributedDataParallel averages
the gradients, so every worker ends with the same weights. The last line each worker prints holds the
all-reduced loss and a fingerprint of its weights: identical lines on every rank mean the workers agreed.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    args = parser.parse_args()

    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
        try:  # on a fractional GPU, stay inside the job's memory slice
            from gpuyard.training import apply_gpu_memory_limit

            apply_gpu_memory_limit(device)
        except ImportError:
            pass
    dist.init_process_group("nccl" if use_cuda else "gloo", init_method="env://", rank=rank, world_size=world)
    print(
        f"rank {rank}/{world} up on {device} (master {os.environ.get('MASTER_ADDR')}:"
        f"{os.environ.get('MASTER_PORT')})",
        flush=True,
    )

    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(
        nn.Linear(2, 1).to(device), device_ids=[device.index] if use_cuda else None
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    true_w, true_b = torch.tensor([[3.0], [-2.0]]), 0.5

    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, 2, generator=data)
        y = x @ true_w + true_b + 0.01 * torch.randn(args.batch, 1, generator=data)
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        optimizer.zero_grad()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        if step % 20 == 0 or step == args.steps:
            print(f"rank {rank} step {step} local loss {loss.item():.6f}", flush=True)

    mean_loss = loss.detach().clone()
    dist.all_reduce(mean_loss)
    mean_loss /= world
    weights = torch.cat([p.detach().flatten().cpu() for p in model.parameters()])
    fingerprint = hashlib.sha256(weights.numpy().tobytes()).hexdigest()[:16]
    print(
        f"final: mean loss {mean_loss.item():.6f} weights {[round(w, 4) for w in weights.tolist()]} "
        f"fingerprint {fingerprint}",
        flush=True,
    )
    # Tear down together: every rank is done with the group (a rank that left early would close the
    # connections another rank's gloo threads still use), and DDP's pending work is released first.
    dist.barrier()
    del model, optimizer
    dist.destroy_process_group()
    # gloo's threads can still be torn down after Python's, and abort the process (SIGABRT, "terminate called
    # without an active exception"; seen on 2 busy cores with torch 2.13): the work is done and printed, so
    # leave without the interpreter's final teardown.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
