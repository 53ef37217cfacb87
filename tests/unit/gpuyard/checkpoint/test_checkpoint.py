"""`gpuyard.checkpoint`: atomic saves (a process killed in the middle of one leaves the earlier checkpoints
loadable, and the next save removes what it left), the last `keep` kept, PyTorch state dicts bit for bit, bytes
and copies of files and folders, a report that cannot be sent never failing a save, and no server package (nor
PyTorch, unless a PyTorch object is saved) imported."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from gpuyard import checkpoint
from gpuyard.checkpoint import CheckpointError
from tests.unit.project.test_import_rules import SERVER_PACKAGES


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def temporaries(folder: Path) -> list[str]:
    return [name for name in names(folder) if name.startswith(checkpoint.TEMPORARY)]


def test_bytes_round_trip_and_the_last_keep_are_kept(tmp_path):
    assert checkpoint.load_latest(directory=tmp_path) is None
    assert checkpoint.latest_step(directory=tmp_path / "none-yet") is None
    for step in range(6):
        checkpoint.save(f"state {step}".encode(), step, keep=3, directory=tmp_path)
    assert names(tmp_path) == [f"step-{n:020d}.bin" for n in (3, 4, 5)]
    assert checkpoint.load_latest(directory=tmp_path) == (5, b"state 5")
    assert checkpoint.latest_step(directory=tmp_path) == 5
    checkpoint.save(b"again", 5, keep=3, directory=tmp_path)  # the same step: replaced
    assert checkpoint.load_latest(directory=tmp_path) == (5, b"again")
    checkpoint.save(b"older", 1, keep=3, directory=tmp_path)  # an older step is kept as saved, the oldest go
    assert [n.split(".")[0][-2:] for n in names(tmp_path)] == ["01", "04", "05"]
    assert checkpoint.load_latest(directory=tmp_path) == (5, b"again")


def test_files_and_folders_are_copied_whole(tmp_path):
    source = tmp_path / "run"
    (source / "sub").mkdir(parents=True)
    (source / "weights.bin").write_bytes(b"\x00\x01" * 1000)
    (source / "sub" / "notes.txt").write_text("epoch 3\n")
    where = tmp_path / "ckpt"
    checkpoint.save(source, 3, directory=where)
    step, copy = checkpoint.load_latest(directory=where)
    assert step == 3 and copy.name == "run" and copy.parent.parent == where
    assert (copy / "weights.bin").read_bytes() == b"\x00\x01" * 1000
    assert (copy / "sub" / "notes.txt").read_text() == "epoch 3\n"
    (source / "weights.bin").write_bytes(b"new")
    checkpoint.save(str(source / "weights.bin"), 3, directory=where)  # the same step again, now a file
    step, copy = checkpoint.load_latest(directory=where)
    assert (step, copy.name, copy.read_bytes()) == (3, "weights.bin", b"new")
    assert len(names(where)) == 1 and not temporaries(where)


def test_a_torch_state_dict_comes_back_bit_for_bit(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 16)).sum().backward()
    optimizer.step()
    state = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "odd": torch.tensor([float("nan")]),
    }
    checkpoint.save(state, 42, directory=tmp_path)
    assert names(tmp_path) == [f"step-{42:020d}.pt"]
    step, loaded = checkpoint.load_latest(directory=tmp_path)
    assert step == 42
    for name, tensor in state["model"].items():
        again = loaded["model"][name]
        assert again.dtype == tensor.dtype and again.shape == tensor.shape
        assert again.numpy().tobytes() == tensor.numpy().tobytes(), name  # bit for bit
    assert loaded["odd"].numpy().tobytes() == state["odd"].numpy().tobytes()  # (a NaN too)
    restored = torch.optim.AdamW(model.parameters(), lr=1e-3)
    restored.load_state_dict(loaded["optimizer"])
    first = next(iter(state["optimizer"]["state"].values()))["exp_avg"]
    assert (
        next(iter(restored.state_dict()["state"].values()))["exp_avg"].numpy().tobytes()
        == first.numpy().tobytes()
    )


KILLED_MID_SAVE = textwrap.dedent(
    """
    import os, sys, time
    from gpuyard import checkpoint

    def stuck(fd):  # the bytes are written, not yet on disk nor renamed: the process dies here
        open(sys.argv[2], "w").close()
        time.sleep(600)

    os.fsync = stuck
    checkpoint.save(b"new" * 100_000, 5, directory=sys.argv[1])
    """
)


def test_a_process_killed_in_the_middle_of_a_save_leaves_the_earlier_checkpoints(tmp_path):
    where, mark = tmp_path / "ckpt", tmp_path / "writing"
    checkpoint.save(b"step four", 4, directory=where)
    child = subprocess.Popen([sys.executable, "-c", KILLED_MID_SAVE, str(where), str(mark)])
    try:
        deadline = time.monotonic() + 30
        while not mark.exists():
            assert child.poll() is None and time.monotonic() < deadline, "the save did not get under way"
            time.sleep(0.02)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    assert len(temporaries(where)) == 1  # what the killed save left
    assert checkpoint.load_latest(directory=where) == (4, b"step four")
    checkpoint.save(b"step six", 6, directory=where)
    assert not temporaries(where)  # removed by the next save
    assert names(where) == [f"step-{4:020d}.bin", f"step-{6:020d}.bin"]
    assert checkpoint.load_latest(directory=where) == (6, b"step six")


def test_a_save_that_fails_says_why_and_changes_nothing(tmp_path, monkeypatch):
    checkpoint.save(b"kept", 1, directory=tmp_path)

    def full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint.os, "replace", full)
    with pytest.raises(CheckpointError, match="No space left on device"):
        checkpoint.save(b"lost", 2, directory=tmp_path)
    monkeypatch.undo()
    assert names(tmp_path) == [f"step-{1:020d}.bin"]
    assert checkpoint.load_latest(directory=tmp_path) == (1, b"kept")


def test_an_object_torch_cannot_save_is_refused_and_leaves_nothing(tmp_path):
    pytest.importorskip("torch")
    checkpoint.save(b"kept", 1, directory=tmp_path)
    with pytest.raises(CheckpointError, match="cannot save checkpoint"):
        checkpoint.save({"not picklable": lambda: 1}, 2, directory=tmp_path)
    assert names(tmp_path) == [f"step-{1:020d}.bin"]


@pytest.mark.parametrize(
    ("call", "why"),
    [
        (lambda d: checkpoint.save(b"x", -1, directory=d), "step must be a whole number"),
        (lambda d: checkpoint.save(b"x", True, directory=d), "step must be a whole number"),
        (lambda d: checkpoint.save(b"x", 1.0, directory=d), "step must be a whole number"),
        (lambda d: checkpoint.save(b"x", 1, keep=0, directory=d), "keep must be a whole number"),
        (lambda d: checkpoint.save(str(d / "absent"), 1, directory=d), "nothing to copy"),
        (lambda d: checkpoint.save(b"x", 1), "no checkpoint folder"),
        (lambda d: checkpoint.load_latest(), "no checkpoint folder"),
    ],
)
def test_what_cannot_be_done_is_said_in_one_line(tmp_path, monkeypatch, call, why):
    monkeypatch.delenv("GPUYARD_CHECKPOINT_DIR", raising=False)
    with pytest.raises(CheckpointError, match=why):
        call(tmp_path)


def test_the_jobs_folder_is_the_default(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUYARD_CHECKPOINT_DIR", str(tmp_path / "job"))
    checkpoint.save(b"in the job's folder", 9)
    assert checkpoint.load_latest() == (9, b"in the job's folder")
    assert checkpoint.latest_step(directory=tmp_path / "job") == 9


def test_a_report_that_cannot_be_sent_is_logged_once_and_never_fails_the_save(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(checkpoint, "_reported_failure", False)
    for name, value in (
        ("GPUYARD_SERVER", "http://127.0.0.1:9"),  # (the discard port: nothing listens there)
        ("GPUYARD_JOB_ID", "0123456789abcdef"),
        ("GPUYARD_CHECKPOINT_TOKEN", "gyjob1.x.y"),
    ):
        monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="gpuyard.checkpoint"):
        for step in range(3):
            checkpoint.save(b"x", step, directory=tmp_path)
    assert checkpoint.latest_step(directory=tmp_path) == 2
    said = [r.getMessage() for r in caplog.records if r.name == "gpuyard.checkpoint"]
    assert len(said) == 1 and said[0].startswith("checkpoint of step 0 saved, but not reported"), said


def test_saving_and_loading_bytes_imports_no_server_package_nor_torch(tmp_path):
    """The light client's rule (tests/unit/project/test_light_client.py): `gpuyard.checkpoint` is the client's."""
    code = (
        "import sys\nfrom gpuyard import checkpoint\n"
        f"checkpoint.save(b'x', 1, directory={str(tmp_path)!r})\n"
        f"assert checkpoint.load_latest(directory={str(tmp_path)!r}) == (1, b'x')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules}))"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    imported = set(eval(done.stdout))  # (a list of names, printed by the child)
    assert not imported & {*SERVER_PACKAGES, "torch", "starlette", "uvicorn"}, imported
