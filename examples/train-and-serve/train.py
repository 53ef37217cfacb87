"""Train a small classifier, export it to ONNX, publish it and deploy it: the whole path from a training job to
a model behind the Open Inference Protocol (port 8000), in one job.

    gpuyard submit examples/train-and-serve/job.yaml --follow
    python examples/train-and-serve/infer.py        # asks the deployed model, checks it against PyTorch

The data is made here (no download): points around NUM_CLASSES centres in FEATURES dimensions, each labelled by
its centre. The network is an MLP (FEATURES -> HIDDEN -> NUM_CLASSES logits); a few hundred steps on a CPU take
about a second. What it leaves in --out: model.onnx (what is served), model.pt (the trained weights, which
infer.py compares the served answers with).

It survives a preemption: every --checkpoint-every steps, and on SIGTERM (at the end of the step under way; then
it exits), it saves a checkpoint with `gpuyard.checkpoint`: the weights, the optimizer, the step and the random
generators (so that the batches still to come are those a run never stopped would draw). Each attempt of the
job resumes from the latest one, and ends with the weights of a run never stopped, bit for bit. Each step it
runs is a line of steps.tsv in the job's output folder (`attempt step loss`; --steps-log): a step run again
after a preemption is there twice. Outside a job it checkpoints only with --checkpoint-dir.

Inside a GPUYARD job, `gpuyard.publish_model` authenticates with the job's own publish token: nothing to type.
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import signal
import sys
import time
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gpuyard import checkpoint

FEATURES = 16
HIDDEN = 64
NUM_CLASSES = 4
INPUT, OUTPUT = "features", "logits"  # the served model's tensor names


class Stopped(Exception):
    """Training stopped on request (SIGTERM) after `step`, whose checkpoint is saved (when it has a folder)."""

    def __init__(self, step: int):
        super().__init__(f"stopped after step {step}")
        self.step = step


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, NUM_CLASSES))


def make_data(samples: int, seed: int, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """`samples` labelled points of the task `seed` (the centres), drawn for `split` (train, test…)."""
    centres = torch.randn(NUM_CLASSES, FEATURES, generator=torch.Generator().manual_seed(seed)) * 1.5
    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{split}".encode()))
    labels = torch.randint(0, NUM_CLASSES, (samples,), generator=generator)
    points = centres[labels] + torch.randn(samples, FEATURES, generator=generator)
    return points, labels


def state(model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> dict[str, Any]:
    """What a checkpoint holds: enough to go on exactly as if never stopped."""
    return {
        "seed": seed,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),  # Adam's moments and step counts
        "torch_rng": torch.get_rng_state(),  # the global generator: the order of the batches still to come
        "python_rng": random.getstate(),  # (unused here: kept for code that adds random augmentations)
    }


def resume(folder: Path | None, model: nn.Module, optimizer: torch.optim.Optimizer, seed: int) -> int:
    """Load the latest checkpoint in `folder` into the model, the optimizer and the random generators; the step it
    was saved after (0: none, a first run)."""
    found = checkpoint.load_latest(directory=folder) if folder is not None else None
    if found is None:
        return 0
    step, saved = found
    if saved["seed"] != seed:
        raise ValueError(f"the checkpoints in {folder} are of --seed {saved['seed']}, not {seed}")
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    torch.set_rng_state(saved["torch_rng"])
    random.setstate(saved["python_rng"])
    print(f"resumed from the checkpoint of step {step}", flush=True)
    return step


def train(
    steps: int,
    seed: int,
    *,
    folder: Path | None = None,
    every: int = 200,
    stop: Callable[[int], bool] = lambda step: False,
    on_step: Callable[[int, float], None] = lambda step, loss: None,
) -> tuple[nn.Module, float]:
    """Train for `steps` steps from the latest checkpoint in `folder` (None: from the start, saving none), saving
    one every `every` steps. `stop(step)`, asked after each step: True saves a checkpoint and raises Stopped.
    `on_step(step, loss)`: called after each step."""
    torch.manual_seed(seed)
    model = make_model()
    points, labels = make_data(4096, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(resume(folder, model, optimizer, seed) + 1, steps + 1):
        batch = torch.randint(0, len(points), (128,))
        optimizer.zero_grad()
        loss = loss_fn(model(points[batch]), labels[batch])
        loss.backward()
        optimizer.step()
        on_step(step, loss.item())
        stopping = stop(step)
        if folder is not None and (stopping or step % every == 0):
            checkpoint.save(state(model, optimizer, seed), step, directory=folder)
        if stopping:
            raise Stopped(step)
        if step % 100 == 0 or step == steps:
            print(f"step {step}/{steps}: loss {loss.item():.4f}", flush=True)
    model.eval()
    test_points, test_labels = make_data(1024, seed, "test")
    with torch.no_grad():
        accuracy = (model(test_points).argmax(1) == test_labels).float().mean().item()
    return model, accuracy


def export(model: nn.Module, path: Path) -> None:
    """ONNX with a batch dimension of any size (the serving side batches requests together)."""
    example = torch.zeros(1, FEATURES)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # (it notes the torchvision ops it skips)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # (the exporter's own deprecation notices)
        torch.onnx.export(
            model,
            (example,),
            str(path),
            input_names=[INPUT],
            output_names=[OUTPUT],
            dynamic_shapes=({0: torch.export.Dim("batch")},),
            dynamo=True,
            external_data=False,
            verbose=False,
        )


class Stopping:
    """A SIGTERM handler (a preemption, a cancel, a time limit) that only takes note: the training saves a
    checkpoint at the end of the step under way and stops."""

    def __init__(self) -> None:
        self.asked = False

    def __call__(self, signum: int, frame: Any) -> None:
        self.asked = True


def step_logger(path: Path | None, pace: float) -> Callable[[int, float], None]:
    """What to do after each step: append `attempt step loss` to `path` (None: nowhere; flushed at once, so that a
    killed attempt's lines stay), then wait what is left of `pace` seconds since the previous step ended."""
    attempt = os.environ.get("GPUYARD_ATTEMPT", "1")
    log = None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        log = path.open("a")
    ended = time.monotonic()

    def on_step(step: int, loss: float) -> None:
        nonlocal ended
        if log is not None:
            log.write(f"{attempt}\t{step}\t{loss:.6f}\n")
            log.flush()
        if pace > 0:
            time.sleep(max(0.0, ended + pace - time.monotonic()))
        ended = time.monotonic()

    return on_step


def job_folder(variable: str, name: str = "") -> Path | None:
    """A folder the job's environment names (with `name` inside it); None outside a job."""
    value = os.environ.get(variable)
    return Path(value, name) if value else None


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="blobs", help="the model's name (default: blobs)")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default: 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the weights (default: 0)")
    parser.add_argument("--out", type=Path, default=Path("train-and-serve-out"), help="where to write")
    parser.add_argument("--gpus", type=float, default=0.25, help="the deployment's GPU share (default 0.25)")
    parser.add_argument("--no-serve", action="store_true", help="publish only, deploy nothing")
    parser.add_argument(
        "--no-publish", action="store_true", help="train and export only (no platform needed)"
    )
    parser.add_argument(
        "--checkpoint-every", type=int, default=200, help="steps between checkpoints (default: 200)"
    )
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=job_folder(checkpoint.DIR_VARIABLE),
        help=f"where to checkpoint (default: the job's {checkpoint.DIR_VARIABLE}; none outside a job)",
    )
    parser.add_argument(
        "--steps-log",
        type=Path,
        default=job_folder("GPUYARD_OUTPUT_DIR", "steps.tsv"),
        help="append `attempt step loss` for each step run (default: steps.tsv in the job's output folder)",
    )
    parser.add_argument(
        "--pace",
        type=float,
        default=0.0,
        help="seconds a step lasts at least, to watch a preemption (default 0)",
    )
    args = parser.parse_args(argv)
    if args.checkpoint_every < 1:
        parser.error("--checkpoint-every must be 1 or more")
    return args


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    stopping = Stopping()
    if args.checkpoint_dir is not None:  # (without a checkpoint, SIGTERM stops it at once, as before)
        signal.signal(signal.SIGTERM, stopping)
    on_step = step_logger(args.steps_log, args.pace)
    try:
        model, accuracy = train(
            args.steps,
            args.seed,
            folder=args.checkpoint_dir,
            every=args.checkpoint_every,
            stop=lambda step: stopping.asked,
            on_step=on_step,
        )
    except Stopped as stopped:
        print(f"{stopped}: its checkpoint is saved, the next attempt resumes from it", flush=True)
        return 0
    except (ValueError, checkpoint.CheckpointError) as exc:
        print(f"train.py: {exc}", file=sys.stderr)
        return 2
    print(f"held-out accuracy: {accuracy:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out / "model.pt")
    export(model, args.out / "model.onnx")
    print(f"exported {args.out / 'model.onnx'}", flush=True)
    if args.no_publish:
        return 0
    if (
        stopping.asked
    ):  # (stopped after training: the next attempt resumes from its latest checkpoint, publishes)
        print("stopped before publishing: the next attempt publishes", flush=True)
        return 0
    return publish(args)


def publish(args: argparse.Namespace) -> int:
    import gpuyard  # (only here: training and export need nothing of the platform)
    from gpuyard.client import ClientError

    serve = None if args.no_serve else {"gpus": args.gpus, "cpus": 0.1, "memory": "256MB"}
    try:
        done = gpuyard.publish_model(args.out / "model.onnx", name=args.name, serve=serve)
    except ClientError as exc:
        print(f"publish failed: {exc}", file=sys.stderr)
        return 1
    print(f"published {done.name} version {done.version}", flush=True)
    if done.deployment is not None:
        jobs = ", ".join(done.deployment.job_ids)
        print(
            f"deploying {done.name}:{done.version} (serve job {jobs}); see: gpuyard models describe {done.name}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
