"""Sentences with numbers for jobs that do not fit: what they need, and the best the cluster has right now."""

from __future__ import annotations

from typing import Any, overload

import numpy as np

from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.contracts.units import count_text, format_size
from gpuyard.shared.scheduling import reasons as R
from gpuyard.shared.scheduling.demand import MILLI, Demand
from gpuyard.shared.scheduling.index import CapacityIndex
from gpuyard.shared.scheduling.model import ANY_PYTHON, EPS, JobRequest


def _matching(index: CapacityIndex, demand: Demand, *, cordoned: bool = False) -> np.ndarray:
    """The nodes with the demand's GPU model: the schedulable ones, or (`cordoned`) the cordoned ones too."""
    mask = np.ones(len(index), dtype=bool) if cordoned else index.schedulable.copy()
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


@overload
def out_of_service(index: CapacityIndex, blocker: R.Blocker, *, nodes: bool = True) -> R.Blocker: ...
@overload
def out_of_service(
    index: CapacityIndex, blocker: R.Blocker | None, *, nodes: bool = True
) -> R.Blocker | None: ...
def out_of_service(
    index: CapacityIndex, blocker: R.Blocker | None, *, nodes: bool = True
) -> R.Blocker | None:
    """`blocker` with the GPUs and (`nodes`) the nodes taken out of service (unhealthy, cordoned) said, when
    there are any: a job that fits no more because of them says why."""
    if blocker is None:
        return None
    counts = index.memo.get("out_of_service")  # (fixed for the index's life: a node change rebuilds it)
    if counts is None:
        counts = index.memo["out_of_service"] = (
            index.blocked_gpus,
            int((~index.schedulable).sum()),
            sum(len(slots) for slots in index.blocked.values()),
        )
    in_service_gpus, cordoned, every_gpu = counts
    gpus, cordoned = (in_service_gpus, cordoned) if nodes else (every_gpu, 0)
    if not gpus and not cordoned:
        return blocker
    parts = []
    if gpus:
        parts.append(f"{count_text(gpus, 'GPU')} unhealthy or cordoned")
    if cordoned:
        parts.append(f"{count_text(cordoned, 'node')} cordoned")
    details = {**blocker.details, "out_of_service_gpus": gpus}
    if nodes:
        details["cordoned_nodes"] = cordoned
    return R.Blocker(blocker.code, f"{blocker.text}; {' and '.join(parts)}", details)


def never_fits(index: CapacityIndex, job: JobRequest, demand: Demand) -> R.Blocker | None:
    """A blocker when the job cannot be placed even on the empty cluster, else None.

    Cordoned and drained nodes count as part of the cluster (an uncordon gives them back): a job that only
    they could hold is not `too_large` but waits in line for them, with the resource it lacks as its code and
    the nodes named (`held_off_by_cordons`). GPUs out of service (unhealthy or cordoned) do not count, and are
    said. A job whose own environment needs a Python version no node offers: `no_python`."""
    if job.python and len(index) and (missing := no_python(index, job.python)) is not None:
        return missing
    every_node = _never_fits(index, job, demand, _matching(index, demand, cordoned=True))
    if every_node is not None:
        return out_of_service(index, every_node, nodes=False)
    if index.schedulable.all() or _never_fits(index, job, demand, _matching(index, demand)) is None:
        return None
    return held_off_by_cordons(index, job, demand)


def no_python(index: CapacityIndex, python: str) -> R.Blocker | None:
    """Why no node could build the job's own environment: none offers its Python version (or none builds
    environments at all); None when one does."""
    if index.python_mask(python).any():
        return None
    offered = sorted(set().union(*index.pythons), key=lambda v: tuple(int(x) for x in v.split(".")))
    nodes = f"the nodes offer python {', '.join(offered)}" if offered else "no node builds job environments"
    wanted = "a Python environment" if python == ANY_PYTHON else f"python {python} for its environment"
    return R.Blocker(
        PendingCode.NO_PYTHON, f"needs {wanted}; {nodes}", {"python": python, "offered": offered}
    )


def held_off_by_cordons(index: CapacityIndex, job: JobRequest, demand: Demand) -> R.Blocker:
    """Why a job waits that would fit on the empty cluster, but only with its cordoned or drained nodes."""
    could = _matching(index, demand, cordoned=True) & ~index.schedulable & (_slots(index, demand) > 0)
    names = [index.names[i] for i in np.flatnonzero(could)]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    if demand.count and demand.whole:
        code, what = PendingCode.INSUFFICIENT_GPUS, f"{count_text(demand.count, 'GPU')} on one node"
    elif demand.count:
        code, what = PendingCode.INSUFFICIENT_GPU_SHARE, f"{demand.fraction:g} of a GPU"
    else:
        code = PendingCode.INSUFFICIENT_CPU_MEMORY
        what = f"{count_text(demand.cpus, 'CPU')} and {format_size(demand.memory)}"
    if job.replicas > 1:
        code, what = PendingCode.GANG_DOES_NOT_FIT, f"{job.replicas} workers × {what} placed together"
    return R.Blocker(
        code,
        f"needs {what}; the nodes that could hold it are out of service: "
        f"{count_text(len(names), 'node')} cordoned or drained ({shown})",
        {"cordoned_nodes": len(names), "nodes": names},
    )


def _slots(index: CapacityIndex, demand: Demand) -> np.ndarray:
    """Per node, how many replicas it could hold were it empty (its GPUs out of service left out)."""
    per_node = np.full(len(index), np.iinfo(np.int64).max // 4, dtype=np.int64)
    if demand.cpus > EPS:
        per_node = np.minimum(per_node, np.floor(index.cpus / demand.cpus + EPS).astype(np.int64))
    if demand.memory > 0:
        per_node = np.minimum(per_node, np.floor(index.memory / demand.memory).astype(np.int64))
    if demand.count:
        gpus = gpu_counts(index, demand)
        slots = gpus // demand.count if demand.whole else gpus * (MILLI // max(demand.milli, 1))
        per_node = np.minimum(per_node, slots)
    return per_node


def _never_fits(index: CapacityIndex, job: JobRequest, demand: Demand, mask: np.ndarray) -> R.Blocker | None:
    """Why no node of `mask` (those with the GPU model asked for) could hold the job were it empty, or None."""
    if not len(index):
        return R.Blocker(PendingCode.NO_NODES, "no node has joined yet (no executor has announced one)", {})
    if demand.count and demand.models and not mask.any():
        models = " or ".join(demand.models)
        return R.Blocker(
            PendingCode.NO_MATCHING_GPU_MODEL,
            f"needs GPU model {models}; no node has one",
            {"gpu_models": list(demand.models)},
        )
    if demand.count and demand.whole:
        gpus = gpu_counts(index, demand)
        largest = int(gpus[mask].max()) if mask.any() else 0
        if largest < demand.count:
            where = index.names[int(np.argmax(np.where(mask, gpus, -1)))] if mask.any() else "none"
            return R.Blocker(
                PendingCode.TOO_LARGE,
                f"needs {count_text(demand.count, 'GPU')} on one node; the largest node has {largest} ({where})",
                {"needed_per_replica": demand.count, "largest_node_gpus": largest, "node": where},
            )
    per_node = np.where(mask, _slots(index, demand), 0)
    if not per_node.any():
        cpus = float(index.cpus[mask].max(initial=0))
        memory = float(index.memory[mask].max(initial=0))
        return R.Blocker(
            PendingCode.TOO_LARGE,
            f"needs {count_text(demand.cpus, 'CPU')} and {format_size(demand.memory)} per replica; the largest "
            f"node has {count_text(cpus, 'CPU')} and {format_size(memory)}",
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
        now, short, details = _short_of(index, demand, mask, job.replicas)
        now = min(now, job.replicas - 1)  # (it did not fit: a GPU model or memory slice the count ignores)
        what = f"{R.gpus_text(job.gpus)}" if demand.count else f"{count_text(demand.cpus, 'CPU')}"
        fit = "none fits now" if not now else f"only about {now} {'fits' if now == 1 else 'fit'} now"
        return R.Blocker(
            PendingCode.GANG_DOES_NOT_FIT,
            f"needs {job.replicas} workers × {what} placed together; {fit}, {short}",
            {"replicas": job.replicas, "fit_now": now, **details},
        )
    if not demand.count:
        best = int(np.argmax(np.where(mask, index.cpu_free, -1)))
        return R.Blocker(
            PendingCode.INSUFFICIENT_CPU_MEMORY,
            f"needs {count_text(demand.cpus, 'CPU')} and {format_size(demand.memory)}; the most free on one node is "
            f"{count_text(float(index.cpu_free[best]), 'CPU')} and {format_size(max(index.mem_free[best], 0))} "
            f"({index.names[best]})",
            {
                "cpus": demand.cpus,
                "memory": demand.memory,
                "best_free_cpus": float(index.cpu_free[best]),
                "best_free_memory": float(max(index.mem_free[best], 0)),
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
    largest_share = max(int(shares[best]), 0) / MILLI
    return R.Blocker(
        PendingCode.INSUFFICIENT_GPU_SHARE,
        f"needs {demand.fraction:g} of a GPU; the largest free share is {largest_share:.3g} ({index.names[best]})",
        {"needed": demand.fraction, "largest_free_share": largest_share, "node": index.names[best]},
    )


def _short_of(
    index: CapacityIndex, demand: Demand, mask: np.ndarray, replicas: int
) -> tuple[int, str, dict[str, Any]]:
    """About how many replicas fit now on the nodes of `mask`, and what limits them: the resource (GPUs, GPU
    share, CPUs or memory) that alone would hold the fewest, with how much of it is free; or, when each alone
    would hold them all, that what is free of each is on different nodes."""
    nodes = np.flatnonzero(mask)
    together = np.full(nodes.size, np.iinfo(np.int64).max // 4, dtype=np.int64)  # per node, all resources
    limits: list[
        tuple[int, str, str, dict[str, Any]]
    ] = []  # (replicas it alone holds, resource, free, details)

    def limit(per_node: np.ndarray, name: str, text: str, details: dict[str, Any]) -> None:
        nonlocal together
        together = np.minimum(together, per_node)
        limits.append((int(per_node.sum()), name, text, details))

    if demand.count and demand.whole:
        idle = index.idle[nodes].astype(np.int64)
        idle_gpus, most_idle = int(idle.sum()), int(idle.max(initial=0))
        text = count_text(idle_gpus, "GPU") + " idle"
        text += f", at most {most_idle} on one node" if most_idle < idle_gpus else ""
        limit(idle // demand.count, "GPUs", text, {"idle_gpus": idle_gpus})
    elif demand.count:
        shares = [sum(share // demand.milli for share in index.free[i]) for i in nodes.tolist()]
        largest = int(index.max_free[nodes].max(initial=0)) / MILLI
        text = f"the largest free share of a GPU is {largest:.3g}"
        limit(np.array(shares, dtype=np.int64), "GPU share", text, {"largest_free_share": largest})
    for name, wanted, free_by_node, render, key in (
        ("CPUs", demand.cpus, index.cpu_free, lambda v: count_text(round(v, 3), "CPU"), "free_cpus"),
        ("memory", demand.memory, index.mem_free, format_size, "free_memory"),
    ):
        if wanted <= EPS:
            continue
        free_here = np.maximum(free_by_node[nodes], 0)
        free, most = float(free_here.sum()), float(free_here.max(initial=0))
        text = f"{render(free)} free" + (f", at most {render(most)} on one node" if most < free else "")
        limit(np.floor(free_here / wanted + EPS).astype(np.int64), name, text, {key: free})
    if not limits:
        return 0, "no node can take them", {}
    now = int(together.sum())
    held, name, text, details = min(limits, key=lambda found: found[0])
    if held >= replicas:  # each resource alone would hold them all: not together on the same nodes
        return now, "the free GPUs, CPUs and memory are not on the same nodes", {}
    return now, f"short of {name}: {text}", {"short_of": name, **details}
