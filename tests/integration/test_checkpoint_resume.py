"""The train → publish → serve example survives a preemption, through `gpuyard up` (real NATS, real processes):
its training job checkpoints every few steps; once a checkpoint is reported, a job of higher priority that needs
its GPUs preempts it (SIGTERM: it saves at the end of the step under way and exits); its next attempt resumes
from the latest checkpoint, finishes and publishes. The steps run over both attempts are at most the target and
one checkpoint interval, and the weights it ends with are those of the same run never stopped, bit for bit (run
as a plain process beside the platform)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import Platform, wait_for

pytest.importorskip("torch")
import torch  # noqa: E402

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train-and-serve"
TARGET, EVERY, SEED = 60, 5, 7
PACE = (
    0.25  # seconds a step of the platform's run lasts at least: time for the preemption to come mid-training
)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("resume")
    env = {"GPUYARD_MIN_RUNTIME_BEFORE_PREEMPTION": "0", "GPUYARD_PREEMPTION_GRACE": "20"}
    p = Platform(base / "data", base / "config", simulate_gpus=2, executors=1, env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


def training(out: Path) -> dict:
    """The example's job as job.yaml has it, holding both GPUs at low priority, with a few paced steps."""
    spec = yaml.safe_load((EXAMPLE / "job.yaml").read_text())
    spec["command"] = [
        *spec["command"][:2],
        *("--out", str(out), "--name", "resumed", "--no-serve", "--seed", str(SEED)),
        *("--steps", str(TARGET), "--checkpoint-every", str(EVERY), "--pace", str(PACE)),
    ]
    spec["resources"]["gpus"] = 2
    return {**spec, "priority": "low"}


def never_stopped(out: Path) -> subprocess.Popen:
    """The same training as a plain process, outside the platform, never stopped."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    command = [sys.executable, str(EXAMPLE / "train.py"), "--out", str(out), "--no-publish"]
    command += ["--seed", str(SEED), "--steps", str(TARGET)]
    return subprocess.Popen(
        command,
        env={**env, "OMP_NUM_THREADS": "1"},  # (as job.yaml: the same threads, the same sums)
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_the_example_resumes_after_a_preemption_to_the_weights_of_a_run_never_stopped(platform, tmp_path):
    client = platform.client()
    plain = never_stopped(tmp_path / "plain")
    job_id = client.submit(training(tmp_path / "out")).job_id
    wait_for(
        lambda: (c := client.job(job_id).checkpoint) is not None and c.step >= EVERY,
        120,
        0.1,
        "a checkpoint of the first attempt reported",
    )
    urgent = {"name": "urgent", "command": "true", "resources": {"gpus": 2, "cpus": 0.1, "memory": "100MB"}}
    urgent_id = client.submit({**urgent, "priority": "critical"}).job_id
    assert platform.wait_state(urgent_id, {"succeeded"}, timeout=60).state == "succeeded"
    job = platform.wait_state(job_id, {"succeeded", "failed"}, timeout=240)
    logs = client.logs(job_id)
    assert job.state == "succeeded", logs
    assert [a.summary for a in job.attempts] == ["preempted: priority", "succeeded"]
    first, second = client.logs(job_id, attempt=1), client.logs(job_id, attempt=2)
    assert "the next attempt resumes from it" in first, first
    assert "resumed from the checkpoint of step" in second and "published resumed version 1" in second, second

    outputs = platform.data_dir / "storage" / "outputs" / job.tenant / job_id
    ran = [line.split("\t") for line in (outputs / "steps.tsv").read_text().splitlines()]
    steps = [int(step) for _, step, _ in ran]
    assert {attempt for attempt, _, _ in ran} == {"1", "2"}
    assert sorted(set(steps)) == list(range(1, TARGET + 1))  # every step run
    assert len(steps) <= TARGET + EVERY, len(steps)  # none run again beyond one checkpoint interval

    said, _ = plain.communicate(timeout=300)
    assert plain.returncode == 0, said
    resumed = torch.load(tmp_path / "out" / "model.pt")
    reference = torch.load(tmp_path / "plain" / "model.pt")
    assert resumed.keys() == reference.keys()
    different = [name for name in reference if not torch.equal(resumed[name], reference[name])]
    assert not different, f"differ from the run never stopped: {different}"
