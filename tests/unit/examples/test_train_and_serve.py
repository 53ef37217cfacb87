"""examples/train-and-serve/train.py resumes from its checkpoints: a run stopped after a step (as SIGTERM stops
it, with a save) or killed (no save) and started again on the same checkpoint folder ends with the weights of a
run never stopped, bit for bit, having run again at most the steps since its last checkpoint; checkpoints of
another seed are refused; and the script itself, sent SIGTERM, saves the step under way and exits 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuyard import checkpoint

pytest.importorskip("torch")
import torch  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "train-and-serve"
STEPS, EVERY, SEED = 30, 10, 5


@pytest.fixture(scope="module")
def train():
    sys.path.insert(0, str(EXAMPLE))
    try:
        import train
    finally:
        sys.path.remove(str(EXAMPLE))
    return train


@pytest.fixture(scope="module")
def never_stopped(train) -> dict[str, torch.Tensor]:
    return train.train(STEPS, SEED)[0].state_dict()


def assert_same_weights(model, expected: dict[str, torch.Tensor]) -> None:
    got = model.state_dict()
    assert got.keys() == expected.keys()
    assert [name for name in expected if not torch.equal(got[name], expected[name])] == []


def wait_for_lines(path: Path, count: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not (path.exists() and path.read_text().count("\n") >= count):
        assert time.monotonic() < deadline, f"{path}: not {count} lines after {seconds}s"
        time.sleep(0.05)


class Killed(Exception):
    """What SIGKILL would do: the attempt ends where it is, saving nothing."""


def test_a_run_stopped_after_a_step_resumes_to_the_weights_of_one_never_stopped(
    train, never_stopped, tmp_path
):
    ran: list[int] = []
    record = lambda step, loss: ran.append(step)  # noqa: E731
    with pytest.raises(train.Stopped) as stopped:
        train.train(STEPS, SEED, folder=tmp_path, every=EVERY, stop=lambda step: step == 13, on_step=record)
    assert stopped.value.step == 13 and checkpoint.latest_step(directory=tmp_path) == 13
    model, _ = train.train(STEPS, SEED, folder=tmp_path, every=EVERY, on_step=record)
    assert ran == list(range(1, STEPS + 1))  # each step once
    assert_same_weights(model, never_stopped)
    assert checkpoint.latest_step(directory=tmp_path) == STEPS  # (a multiple of EVERY)


def test_a_run_killed_mid_interval_redoes_the_steps_since_its_last_checkpoint(train, never_stopped, tmp_path):
    ran: list[int] = []

    def killed_at_13(step: int, loss: float) -> None:
        ran.append(step)
        if step == 13:
            raise Killed

    with pytest.raises(Killed):
        train.train(STEPS, SEED, folder=tmp_path, every=EVERY, on_step=killed_at_13)
    assert checkpoint.latest_step(directory=tmp_path) == EVERY
    model, _ = train.train(
        STEPS, SEED, folder=tmp_path, every=EVERY, on_step=lambda step, loss: ran.append(step)
    )
    assert ran == [*range(1, 14), *range(EVERY + 1, STEPS + 1)]  # 11 to 13 again: fewer than EVERY
    assert_same_weights(model, never_stopped)


def test_checkpoints_of_another_seed_are_refused(train, tmp_path):
    with pytest.raises(train.Stopped):
        train.train(STEPS, SEED, folder=tmp_path, stop=lambda step: step == 2)
    with pytest.raises(ValueError, match=f"are of --seed {SEED}, not {SEED + 1}"):
        train.train(STEPS, SEED + 1, folder=tmp_path)


def test_on_sigterm_the_script_saves_the_step_under_way_and_exits_0(tmp_path):
    log = tmp_path / "steps.tsv"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    process = subprocess.Popen(
        [
            sys.executable,
            str(EXAMPLE / "train.py"),
            *("--checkpoint-dir", str(tmp_path / "checkpoints"), "--steps-log", str(log)),
            *("--steps", "100000", "--pace", "0.02", "--no-publish", "--out", str(tmp_path / "out")),
        ],
        env={**env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for_lines(log, 3)
        process.send_signal(signal.SIGTERM)
        said, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, said
    last = int(log.read_text().splitlines()[-1].split("\t")[1])
    assert f"stopped after step {last}: its checkpoint is saved" in said, said
    assert checkpoint.latest_step(directory=tmp_path / "checkpoints") == last
    assert not (tmp_path / "out").exists()  # stopped in training: nothing exported
