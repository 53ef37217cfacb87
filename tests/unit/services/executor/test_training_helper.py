"""gpuyard.training: the job-side helper that applies the GPU memory share to PyTorch (a stand-in torch here:
the CPU build has no CUDA to cap)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from gpuyard.training import apply_gpu_memory_limit, distributed_env, gpu_memory_share

GiB = 2**30


class FakeCuda:
    def __init__(self, total: int, available: bool = True):
        self.total, self.available = total, available
        self.calls: list[tuple[float, object]] = []

    def is_available(self):
        return self.available

    def current_device(self):
        return 0

    def get_device_properties(self, device):
        return SimpleNamespace(total_memory=self.total)

    def set_per_process_memory_fraction(self, fraction, device):
        self.calls.append((fraction, device))


@pytest.fixture
def cuda(monkeypatch):
    fake = FakeCuda(total=80 * GiB)
    torch = SimpleNamespace(cuda=fake, device=lambda kind, index=None: (kind, index))
    monkeypatch.setitem(sys.modules, "torch", torch)
    return fake


def test_the_share_caps_pytorchs_allocator(cuda):
    fraction = apply_gpu_memory_limit(environ={"GPUYARD_GPU_MEMORY_FRACTION": "0.5"})
    assert fraction == 0.5 and cuda.calls == [(0.5, ("cuda", 0))]


def test_a_slice_smaller_than_the_fraction_wins(cuda):
    env = {"GPUYARD_GPU_MEMORY_FRACTION": "0.5", "GPUYARD_GPU_MEMORY_BYTES": str(20 * GiB)}
    assert apply_gpu_memory_limit(environ=env) == 0.25 and cuda.calls[0][0] == 0.25


def test_a_whole_gpu_or_no_cuda_changes_nothing(cuda):
    assert apply_gpu_memory_limit(environ={}) is None
    cuda.available = False
    assert apply_gpu_memory_limit(environ={"GPUYARD_GPU_MEMORY_FRACTION": "0.5"}) is None
    assert cuda.calls == []


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"GPUYARD_GPU_MEMORY_FRACTION": "half"}, "GPUYARD_GPU_MEMORY_FRACTION='half' is not a number"),
        ({"GPUYARD_GPU_MEMORY_FRACTION": "1.5"}, "must be in (0, 1]"),
        ({"GPUYARD_GPU_MEMORY_BYTES": "4GB"}, "GPUYARD_GPU_MEMORY_BYTES='4GB' is not a whole number"),
    ],
)
def test_bad_values_are_named(env, words):
    with pytest.raises(ValueError) as err:
        gpu_memory_share(env)
    assert words in str(err.value)


def test_distributed_env_reads_torchruns_variables():
    env = distributed_env(
        {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1234"}
    )
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size, env.master_port) == (
        3,
        4,
        1,
        2,
        1234,
    )
    assert distributed_env({}).world_size == 1
