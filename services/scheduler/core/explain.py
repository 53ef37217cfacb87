"""Sentences with numbers for jobs that do not fit: what they need, and the best the cluster has right now."""

from __future__ import annotations

import numpy as np

from services.scheduler.core import reasons as R
from services.scheduler.core.demand import MILLI, Demand
from services.scheduler.core.index import CapacityIndex
from services.scheduler.core.model import EPS, JobRequest
from shared.reasons import PendingCode
from shared.units import count_text, format_size


def _matching(index: CapacityIndex, demand: Demand) -> np.ndarray:
    mask = index.schedulable.copy()
    if demand.count and demand.models:
        mask &= index.model_mask(demand.models)
    return mask


def gpu_counts(index: CapacityIndex, demand: Demand) -> np.ndarray:
    """GPUs per node that could ever hold one GPU of the demand (model and memory), empty cluster."""
    key = ("gpu_counts", demand.models, demand.gpu_memory)
    found = index.memo.get(key)
    if found is not None:
        return found
    blocked = index.blocked
    if not demand.models and not demand.gpu_memory:
        out = np.array([len(row) for row in index.free], dtype=np.int64)
        for i, slots in blocked.items():
            out[i] -= len(slots)
        index.memo[key] = out
        return out
    wanted = {index.states.model_id(m) for m in demand.models} if demand.models else None
    out = np.zeros(len(index), dtype=np.int64)
    for i, (models, mems) in enumerate(zip(index.gpu_models, index.gpu_memory_total, strict=True)):
        out_of_service = blocked.get(i, ())
        out[i] = sum(
            1
            for s, (m, mem) in enumerate(zip(models, mems, strict=True))
            if (wanted is None or m in wanted) and mem >= demand.gpu_memory and s not in out_of_service
        )
    index.memo[key] = out
    return out


def out_of_service(index: CapacityIndex, blocker: R.Blocker | None) -> R.Blocker | None:
    """`blocker` with the GPUs and nodes taken out of service (unhealthy, cordoned) said, when there are any:
    a job that fits no more because of them says why."""
    if blocker is None:
        return None
    counts = index.memo.get("out_of_service")  # (fixed for the index's life: a node change rebuilds it)
    if counts is None:
        counts = index.memo["out_of_service"] = (index.blocked_gpus, int((~index.schedulable).sum()))
    gpus, nodes = counts
    if not gpus and not nodes:
        return blocker
    parts = []
    if gpus:
        parts.append(f"{count_text(gpus, 'GPU')} unhealthy or cordoned")
    if nodes:
        parts.append(f"{count_text(nodes, 'node')} cordoned")
    return R.Blocker(
        blocker.code,
        f"{blocker.text}; {' and '.join(parts)}",
        {**blocker.details, "out_of_service_gpus": gpus, "cordoned_nodes": nodes},
    )


def never_fits(index: CapacityIndex, job: JobRequest, demand: Demand) -> R.Blocker | None:
    """A blocker when the job cannot fit even on the empty cluster (as listed now, without its GPUs and nodes
    out of service), else None."""
    return out_of_service(index, _never_fits(index, job, demand))


def _never_fits(index: CapacityIndex, job: JobRequest, demand: Demand) -> R.Blocker | None:
    if not len(index):
        return R.Blocker(PendingCode.NO_NODES, "no node has joined yet (no executor has announced one)", {})
    mask = _matching(index, demand)
    if demand.count and demand.models and not mask.any():
        models = " or ".join(demand.models)
        return R.Blocker(
            PendingCode.NO_MATCHING_GPU_MODEL,
            f"needs GPU model {models}; no node has one",
            {"gpu_models": list(demand.models)},
        )
    per_node = np.full(len(index), np.iinfo(np.int64).max // 4, dtype=np.int64)
    if demand.cpus > EPS:
        per_node = np.minimum(per_node, np.floor(index.cpus / demand.cpus + EPS).astype(np.int64))
    if demand.memory > 0:
        per_node = np.minimum(per_node, np.floor(index.memory / demand.memory).astype(np.int64))
    if demand.count:
        gpus = gpu_counts(index, demand)
        slots = gpus // demand.count if demand.whole else gpus * (MILLI // max(demand.milli, 1))
        per_node = np.minimum(per_node, slots)
        largest = int(gpus[mask].max()) if mask.any() else 0
        if demand.whole and largest < demand.count:
            where = index.names[int(np.argmax(np.where(mask, gpus, -1)))] if mask.any() else "none"
            return R.Blocker(
                PendingCode.TOO_LARGE,
                f"needs {count_text(demand.count, 'GPU')} on one node; the largest node has {largest} ({where})",
                {"needed_per_replica": demand.count, "largest_node_gpus": largest, "node": where},
            )
    per_node = np.where(mask, per_node, 0)
    if not per_node.any():
        return R.Blocker(
            PendingCode.TOO_LARGE,
            f"needs {count_text(demand.cpus, 'CPU')} and {format_size(demand.memory)} per replica; the largest node has "
            f"{count_text(float(index.cpus.max(initial=0)), 'CPU')} and {format_size(float(index.memory.max(initial=0)))}",
            {"cpus": demand.cpus, "memory": demand.memory},
        )
    total = int(per_node.sum())
    if total < job.replicas:
        return R.Blocker(
            PendingCode.TOO_LARGE,
            f"needs {job.replicas} workers at once; the whole cluster holds only {total} of them",
            {"replicas": job.replicas, "cluster_slots": total},
        )
    return None


def no_room_now(index: CapacityIndex, job: JobRequest, demand: Demand) -> R.Blocker:
    """Why the job does not fit on the cluster as it is now (it would fit on the empty cluster), with the GPUs
    and nodes out of service said (`out_of_service`). With
    `index.restrict` set (`scarcity`: nodes kept for jobs that fit nowhere else), on the nodes it leaves."""
    blocker = out_of_service(index, _no_room_now(index, job, demand))
    if index.restrict is None:
        return blocker
    kept = int((index.schedulable & ~index.restrict).sum())
    return R.Blocker(
        blocker.code,
        f"{blocker.text}; {count_text(kept, 'node')} kept for waiting jobs that fit only there",
        {**blocker.details, "kept_nodes": kept},
    )


def _no_room_now(index: CapacityIndex, job: JobRequest, demand: Demand) -> R.Blocker:
    mask = _matching(index, demand)
    if index.restrict is not None:
        mask &= index.restrict
    resources_ok = (index.cpu_free >= demand.cpus - EPS) & (index.mem_free >= demand.memory) & mask
    if job.replicas > 1:
        fits_one = index.candidates(demand)
        if demand.whole:
            now = int((index.idle[fits_one] // demand.count).sum()) if fits_one.size else 0
        else:
            now = int(fits_one.size)
        what = f"{R.gpus_text(job.gpus)}" if demand.count else f"{count_text(demand.cpus, 'CPU')}"
        return R.Blocker(
            PendingCode.GANG_DOES_NOT_FIT,
            f"needs {job.replicas} workers × {what} placed together; only about {min(now, job.replicas - 1)} fit now",
            {"replicas": job.replicas, "fit_now": min(now, job.replicas - 1)},
        )
    if not demand.count:
        best = int(np.argmax(np.where(mask, index.cpu_free, -1)))
        return R.Blocker(
            PendingCode.INSUFFICIENT_CPU_MEMORY,
            f"needs {count_text(demand.cpus, 'CPU')} and {format_size(demand.memory)}; the most free on one node is "
            f"{count_text(float(index.cpu_free[best]), 'CPU')} ({index.names[best]})",
            {
                "cpus": demand.cpus,
                "memory": demand.memory,
                "best_free_cpus": float(index.cpu_free[best]),
                "node": index.names[best],
            },
        )
    if demand.whole:
        largest_any = np.where(mask, index.idle, -1)
        best = int(np.argmax(largest_any))
        largest = int(max(largest_any[best], 0))
        if largest >= demand.count:
            return R.Blocker(
                PendingCode.INSUFFICIENT_CPU_MEMORY,
                f"needs {count_text(demand.count, 'GPU')} with {count_text(demand.cpus, 'CPU')} and {format_size(demand.memory)} on one node; "
                f"the nodes with {count_text(demand.count, 'free GPU')} lack CPUs or memory",
                {"needed_per_replica": demand.count, "cpus": demand.cpus, "memory": demand.memory},
            )
        return R.Blocker(
            PendingCode.INSUFFICIENT_GPUS,
            f"needs {count_text(demand.count, 'GPU')} on one node; the largest free block is {largest} ({index.names[best]})",
            {"needed_per_replica": demand.count, "largest_free": largest, "node": index.names[best]},
        )
    shares = np.where(mask, index.max_free, -1)
    best = int(np.argmax(shares))
    if (shares[resources_ok] >= demand.milli).any():
        return R.Blocker(
            PendingCode.INSUFFICIENT_GPU_SHARE,
            f"needs {demand.fraction:g} of a GPU with {format_size(demand.gpu_memory)} of its memory; no GPU with that "
            f"share free has that memory free",
            {"needed": demand.fraction, "gpu_memory": demand.gpu_memory},
        )
    if (shares >= demand.milli).any():
        return R.Blocker(
            PendingCode.INSUFFICIENT_CPU_MEMORY,
            f"needs {demand.fraction:g} of a GPU with {count_text(demand.cpus, 'CPU')} and {format_size(demand.memory)}; the nodes "
            f"with that share free lack CPUs or memory",
            {"needed": demand.fraction, "cpus": demand.cpus, "memory": demand.memory},
        )
    largest = max(int(shares[best]), 0) / MILLI
    return R.Blocker(
        PendingCode.INSUFFICIENT_GPU_SHARE,
        f"needs {demand.fraction:g} of a GPU; the largest free share is {largest:.3g} ({index.names[best]})",
        {"needed": demand.fraction, "largest_free_share": largest, "node": index.names[best]},
    )
