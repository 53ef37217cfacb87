"""GPUYard's placement policy: the CPU-stranding term, next to FGD's choice on the same cluster."""

from __future__ import annotations

import numpy as np

from gpuyard.shared.scheduling import SchedulerConfig
from gpuyard.shared.scheduling.fragmentation import Fragmenter, TaskShape
from gpuyard.shared.scheduling.placement.gpuyard import stranded
from tests.unit.services.scheduler.builders import cluster, decide_snapshot, job, node, where

# a workload of 1-GPU tasks asking for 11 CPUs each, and some CPU-only tasks
POPULARITY = ((TaskShape(11.0, 1000, 1), 0.8), (TaskShape(30.0, 0, 0), 0.2))


def config(policy: str) -> SchedulerConfig:
    return SchedulerConfig(policy=policy, shape_popularity=POPULARITY)


def test_typical_cpus_per_gpu_come_from_the_gpu_shapes() -> None:
    assert Fragmenter(POPULARITY).cpus_per_gpu == 11.0
    shares = ((TaskShape(4.0, 500, 1), 0.5), (TaskShape(12.0, 1000, 2), 0.5))
    assert Fragmenter(shares).cpus_per_gpu == (0.5 * 4 + 0.5 * 12) / (0.5 * 0.5 + 0.5 * 2)
    assert Fragmenter(((TaskShape(8.0, 0, 0), 1.0),)).cpus_per_gpu == 0.0  # no GPU shapes: no term


def test_stranded_capacity() -> None:
    free = np.array([8000.0, 8000.0, 2000.0, 0.0])
    cpus = np.array([96.0, 66.0, 4.0, 10.0])
    assert stranded(free, cpus, 11.0).tolist() == [0.0, 8000 - 6000.0, 2000 - 1000 * 4 / 11, 0.0]


def test_cpu_only_task_keeps_off_the_cpus_a_gpu_node_needs() -> None:
    """FGD sees no growth on either node (every shape still fits once) and takes the first node; GPUYard sees
    that 66 CPUs cannot feed 8 GPUs at 11 CPUs each and takes the CPU-rich node."""

    def state():
        return cluster(node("dense", 8, cpus=96), node("rich", 2, cpus=104))

    queue = [job("cpu", 0, cpus=30)]
    assert where(decide_snapshot(state(), queue, config("fgd")), "cpu") == [("dense", ())]
    assert where(decide_snapshot(state(), queue, config("gpuyard")), "cpu") == [("rich", ())]


def test_gpu_task_with_few_cpus_goes_where_cpus_are_short() -> None:
    """A 1-GPU task with 2 CPUs on the CPU-poor node uses a GPU the typical task could not have fed there."""

    def state():
        return cluster(node("rich", 2, cpus=104), node("poor", 2, cpus=12))

    queue = [job("light", 1, cpus=2)]
    assert where(decide_snapshot(state(), queue, config("fgd")), "light")[0][0] == "rich"
    assert where(decide_snapshot(state(), queue, config("gpuyard")), "light")[0][0] == "poor"


def test_model_pressure_per_model_and_computed_once() -> None:
    from gpuyard.shared.scheduling.index import CapacityIndex
    from gpuyard.shared.scheduling.placement.gpuyard import model_pressure

    index = CapacityIndex(
        ["a", "b", "c"],
        [["T4"] * 2, ["A100"] * 4, ["T4", "A100"]],
        [[16] * 2, [80] * 4, [16, 80]],
        [8, 8, 8],
        [1, 1, 1],
    )
    fragmenter = Fragmenter(((TaskShape(1, 1000, 1, ("T4",)), 0.5), (TaskShape(1, 1000, 1), 0.5)))
    pressure = model_pressure(index, fragmenter)
    t4, a100 = index.states.model_id("T4"), index.states.model_id("A100")
    assert pressure[t4] == 0.5 / 3 * 8  # T4-only demand over the T4s' share (3 of 8 GPUs)
    assert pressure[a100] == 0.0 and pressure[-1] == pressure[-2] == 0.0
    assert model_pressure(index, fragmenter) is pressure  # memoised on the index
