"""The shapes of the jobs around (waiting and running): what a placement policy that keeps room for the typical
shapes (`needs_popularity`) reads at the start of a cycle."""

from __future__ import annotations

from collections import Counter
from operator import attrgetter

from gpuyard.shared.scheduling.demand import demand_of
from gpuyard.shared.scheduling.fragmentation import shape_of, typical_shapes
from gpuyard.shared.scheduling.model import Allocation, JobRequest, SchedulerConfig
from gpuyard.shared.scheduling.placement import POLICIES
from gpuyard.shared.scheduling.queue import HeldQueue
from gpuyard.shared.scheduling.quota import RunningKinds

_KEY = attrgetter("key")


def popularity_for(
    config: SchedulerConfig,
    queue: list[JobRequest] | HeldQueue,
    running: list[Allocation],
    kinds: RunningKinds | None = None,
) -> tuple:
    """The typical shapes by how many jobs have them (`fragmentation.typical_shapes`); () for a policy that
    does not read them; the configuration's own when it sets them."""
    if config.shape_popularity is not None:
        return tuple(config.shape_popularity)
    if not POLICIES[config.policy].needs_popularity:
        return ()
    # jobs per key (kept by a held queue), then per (GPUs, CPUs, GPU models), then per task shape (a handful)
    keys = Counter(queue.keys) if isinstance(queue, HeldQueue) else Counter(map(_KEY, queue))
    kinds = kinds if kinds is not None else RunningKinds(running)
    for (_tenant, _user, key), n in kinds.counts.items():
        keys[key] += n
    counts: Counter = Counter()
    for (gpus, _replicas, cpus, _memory, _gpu_memory, models, *_rest), n in keys.items():
        counts[gpus, cpus, models] += n
    shapes: Counter = Counter()
    for (gpus, cpus, models), n in counts.items():
        shapes[shape_of(demand_of(JobRequest("", "", gpus=gpus, cpus=cpus, gpu_models=models)))] += n
    return typical_shapes(shapes)
