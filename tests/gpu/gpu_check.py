"""Real-GPU check of the whole platform, for a machine with an NVIDIA GPU and PyTorch (never run in CI).

    OUT=/tmp/out PYTHONPATH=$PWD python3 tests/gpu/gpu_check.py

Starts `gpuyard up` with the real NVML inventory (memory-slice policy `stop`, 2 s grace) and runs four jobs:
a whole GPU (pinned by UUID, PyTorch sees one device), a quarter GPU that asks for more than its slice through
`gpuyard.training.apply_gpu_memory_limit` (PyTorch refuses: CUDA out of memory), a quarter GPU that fits, and a
tenth of a GPU that takes 20 GB without the helper (the executor's NVML watch stops it). Prints each job's
outcome, log and events; docs/executor.md has what it printed on an H100.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.getcwd())
from gpuyard.client import Client  # noqa: E402

OUT = Path(os.environ.get("OUT", "/tmp/gpuyard-gpu-check"))
OUT.mkdir(parents=True, exist_ok=True)
env = {
    **os.environ,
    "GPUYARD_CONFIG_DIR": "/tmp/gy/config",
    "GPUYARD_GPU_MEMORY_POLICY": "stop",
    "GPUYARD_GPU_MEMORY_GRACE": "2",
    "GPUYARD_GPU_MEMORY_INTERVAL": "1",
}
up = subprocess.Popen(
    [
        sys.executable,
        "-m",
        "gpuyard.cli",
        "up",
        "--data-dir",
        "/tmp/gy/data",
        "--port",
        "18080",
        "--nats-port",
        "14222",
        "--node-name",
        "h100",
    ],
    env=env,
    stdout=(OUT / "up.log").open("wb"),
    stderr=subprocess.STDOUT,
)
client = None
for _ in range(120):
    try:
        token = json.loads(Path("/tmp/gy/config/config.json").read_text())["token"]
        client = Client("http://127.0.0.1:18080", token)
        if client.healthy() and client.request("GET", "/v1/nodes"):
            break
    except Exception:
        pass
    time.sleep(0.5)
print("NODES", json.dumps(client.request("GET", "/v1/nodes"), indent=1))
PY = {"PYTHONPATH": os.environ.get("PYTHONPATH", os.getcwd())}
jobs = {
    "whole": {
        "command": [
            "python3",
            "-c",
            "import os, torch; print('CVD', os.environ['CUDA_VISIBLE_DEVICES'], torch.cuda.device_count(), torch.cuda.get_device_name(0))",
        ],
        "resources": {"gpus": 1},
        "env": PY,
    },
    "slice_refuses": {
        "command": [
            "python3",
            "-c",
            "import os; from gpuyard.training import apply_gpu_memory_limit as a; print(a(), os.environ.get('GPUYARD_GPU_MEMORY_BYTES')); import torch; x = torch.empty(int(30e9), dtype=torch.uint8, device='cuda'); print('allocated 30GB?!')",
        ],
        "resources": {"gpus": 0.25},
        "env": PY,
    },
    "slice_fits": {
        "command": [
            "python3",
            "-c",
            "from gpuyard.training import apply_gpu_memory_limit as a; a(); import torch; x = torch.empty(int(5e9), dtype=torch.uint8, device='cuda'); print('allocated 5GB')",
        ],
        "resources": {"gpus": 0.25},
        "env": PY,
    },
    "over_slice_stopped": {
        "command": [
            "python3",
            "-c",
            "import torch, time; x = torch.empty(int(20e9), dtype=torch.uint8, device='cuda'); print('holding 20GB', flush=True); time.sleep(60)",
        ],
        "resources": {"gpus": 0.1},
        "env": PY,
    },
}
ids = {name: client.submit(spec)["job_id"] for name, spec in jobs.items()}
deadline = time.time() + 150
while time.time() < deadline:
    states = {n: client.job(i)["state"] for n, i in ids.items()}
    if all(s in ("succeeded", "failed", "cancelled") for s in states.values()):
        break
    time.sleep(1)
for name, job_id in ids.items():
    job = client.job(job_id)
    print(
        "JOB",
        name,
        job["state"],
        job.get("failure_reason"),
        job.get("message"),
        job["placements"][0]["gpus"] if job["placements"] else None,
    )
    print("  LOG", client.logs(job_id, replica=0)[-600:].replace("\n", " | "))
    events = [e["event"]["type"].rsplit(".", 1)[-1] for e in client.events(job_id)]
    print("  EVENTS", events)
alerts = subprocess.run(
    ["grep", "-i", "gpu memory\\|slice\\|nvml", str(OUT / "up.log")], capture_output=True, text=True
).stdout
print("ALERT LINES", alerts[-2000:])
up.send_signal(2)
up.wait(60)
