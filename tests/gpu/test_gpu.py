"""The whole platform on a real NVIDIA GPU: `gpuyard up` with the NVML inventory (memory-slice policy `stop`,
2 s grace) runs four jobs and each ends as docs/executor.md ("Checked on a real GPU") says. Collected with
the rest of the suite; skipped, with the reason, where there is no NVIDIA GPU or no PyTorch with CUDA.

    pytest -q tests/gpu            # on a GPU machine
"""

from __future__ import annotations

import os
import sys

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuyard.shared.auth.secretfile import METRICS_TOKEN_FILE
from tests.integration.conftest import Platform

GIB = 1 << 30


def nvidia_gpus() -> tuple[list[tuple[str, int]], str]:
    """(uuid, memory bytes) of each NVIDIA GPU NVML sees, or [] and why there is none."""
    try:
        import pynvml
    except ImportError:
        return [], "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return [], f"no NVIDIA GPU: NVML cannot start ({exc})"
    try:
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        found = [(pynvml.nvmlDeviceGetUUID(h), pynvml.nvmlDeviceGetMemoryInfo(h).total) for h in handles]
    finally:
        pynvml.nvmlShutdown()
    return found, "" if found else "no NVIDIA GPU: NVML finds none"


def torch_cuda() -> str:
    """Why PyTorch cannot use CUDA here; empty when it can (the jobs are PyTorch programs)."""
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed (pip install -e '.[train]' with a CUDA build)"
    return "" if torch.cuda.is_available() else "PyTorch is installed without CUDA or sees no GPU"


GPUS, WHY_NOT = nvidia_gpus()
WHY_NOT = WHY_NOT or torch_cuda()
pytestmark = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT)

PY = {"PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
JOBS = {
    "whole": {
        "command": [
            sys.executable,
            "-c",
            "import os, torch; print('CVD', os.environ['CUDA_VISIBLE_DEVICES'], torch.cuda.device_count(), "
            "torch.cuda.get_device_name(0))",
        ],
        "resources": {"gpus": 1},
    },
    "slice_refuses": {  # asks for 30 GB, more than a quarter of the GPU, after applying its slice
        "command": [
            sys.executable,
            "-c",
            "import os; from gpuyard.training import apply_gpu_memory_limit as a; "
            "print('FRACTION', a(), os.environ['GPUYARD_GPU_MEMORY_BYTES'], flush=True); import torch; "
            "x = torch.empty(int(30e9), dtype=torch.uint8, device='cuda'); print('allocated 30GB')",
        ],
        "resources": {"gpus": 0.25},
    },
    "slice_fits": {
        "command": [
            sys.executable,
            "-c",
            "from gpuyard.training import apply_gpu_memory_limit as a; a(); import torch; "
            "x = torch.empty(int(5e9), dtype=torch.uint8, device='cuda'); print('allocated 5GB')",
        ],
        "resources": {"gpus": 0.25},
    },
    "over_slice_stopped": {  # takes 20 GB of a tenth of the GPU without the helper: the executor stops it
        "command": [
            sys.executable,
            "-c",
            "import torch, time; x = torch.empty(int(20e9), dtype=torch.uint8, device='cuda'); "
            "print('holding 20GB', flush=True); time.sleep(120)",
        ],
        "resources": {"gpus": 0.1},
    },
}


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> dict:
    """The node list `gpuyard up` announced, and every job of JOBS run on the real GPU at once to its end:
    {"nodes": [...], name: (JobOut, its log)}."""
    if GPUS[0][1] < 32 * GIB:
        pytest.skip(f"the jobs need a GPU with at least 32 GiB; this one has {GPUS[0][1] / GIB:.0f} GiB")
    base = tmp_path_factory.mktemp("gpu")
    env = {
        "GPUYARD_GPU_MEMORY_POLICY": "stop",
        "GPUYARD_GPU_MEMORY_GRACE": "2",
        "GPUYARD_GPU_MEMORY_INTERVAL": "1",
    }
    platform = Platform(base / "data", base / "config", simulate_gpus=0, env=env, executors=1).start()
    try:
        client = platform.client()
        out: dict = {"nodes": client.nodes()}
        ids = {name: client.submit({**spec, "env": PY}).job_id for name, spec in JOBS.items()}
        for name, job_id in ids.items():
            job = platform.wait_state(job_id, {"succeeded", "failed", "cancelled"}, timeout=240)
            out[name] = (job, client.logs(job_id))
        token = (platform.data_dir / METRICS_TOKEN_FILE).read_text().strip()
        out["metrics"] = httpx.get(
            f"http://127.0.0.1:{platform.monitor_port}/metrics",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ).text
        out["nodes_after"] = client.nodes()
        yield out
    finally:
        platform.stop()


def test_the_node_announces_the_gpus_nvml_sees(ran):
    (node,) = ran["nodes"]
    assert sorted((g.uuid, g.memory_bytes) for g in node.gpus) == sorted(GPUS)


def test_a_whole_gpu_is_pinned_by_uuid_and_pytorch_sees_one_device(ran):
    job, log = ran["whole"]
    assert job.state == "succeeded", (job.message, log)
    line = next(line for line in log.splitlines() if line.startswith("CVD "))
    _, visible, count, *_ = line.split()
    assert visible in {uuid for uuid, _ in GPUS} and count == "1"
    assert [g.fraction for g in job.placements[0].gpus] == [1.0]


def test_a_quarter_gpu_is_refused_more_than_its_slice_by_pytorch(ran):
    job, log = ran["slice_refuses"]
    assert job.state == "failed" and job.failure.reason == "cuda_oom", (job.message, log)
    fraction, limit = next(line for line in log.splitlines() if line.startswith("FRACTION ")).split()[1:]
    assert float(fraction) == pytest.approx(0.25)
    assert int(limit) == pytest.approx(0.25 * GPUS[0][1], rel=0.01)
    assert "allocated 30GB" not in log


def test_a_quarter_gpu_within_its_slice_succeeds(ran):
    job, log = ran["slice_fits"]
    assert job.state == "succeeded" and "allocated 5GB" in log, (job.message, log)


def test_a_job_over_its_slice_is_stopped_by_the_executors_nvml_watch(ran):
    job, log = ran["over_slice_stopped"]
    assert "holding 20GB" in log
    assert job.state == "failed" and job.failure.reason == "gpu_memory_exceeded", (job.message, log)
    assert "over its slice" in job.failure.message and "node policy: stop" in job.failure.message


DCGM_READ = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
)


def test_the_monitor_reads_every_gpu_through_nvml_under_the_dcgm_names(ran):
    """The monitor's real NVML path: each GPU NVML sees is on /metrics under the DCGM exporter's
    names and UUID label, with figures a working GPU gives; GET /v1/nodes shows the same sample."""
    families = {f.name: f for f in text_string_to_metric_families(ran["metrics"])}
    for uuid, memory in GPUS:
        read = {}
        for name in DCGM_READ:
            values = [s.value for s in families[name].samples if s.labels.get("UUID") == uuid]
            assert values, f"{name} has no series for {uuid}"
            read[name] = values[0]
        assert 0 <= read["DCGM_FI_DEV_GPU_UTIL"] <= 100 and 0 < read["DCGM_FI_DEV_GPU_TEMP"] < 120, read
        assert read["DCGM_FI_DEV_POWER_USAGE"] > 0 and read["DCGM_FI_DEV_SM_CLOCK"] > 0, read
        total_mib = read["DCGM_FI_DEV_FB_USED"] + read["DCGM_FI_DEV_FB_FREE"]
        assert abs(total_mib - memory / 2**20) <= 0.02 * memory / 2**20, (total_mib, memory)
        print(f"NVML via the monitor, {uuid}: {read}")  # (pytest -s: the figures docs/benchmarks.md records)
    gpus = {g.uuid: g for n in ran["nodes_after"] for g in n.gpus}
    for uuid, _ in GPUS:
        assert gpus[uuid].temperature_c is not None and gpus[uuid].utilization_pct is not None
