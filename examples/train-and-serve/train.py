"""Train a small classifier, export it to ONNX, publish it and deploy it: the whole path from a training job to
a model behind the Open Inference Protocol (port 8000), in one job.

    gpuyard submit examples/train-and-serve/job.yaml --follow
    python examples/train-and-serve/infer.py        # asks the deployed model, checks it against PyTorch

The data is made here (no download): points around NUM_CLASSES centres in FEATURES dimensions, each labelled by
its centre. The network is an MLP (FEATURES -> HIDDEN -> NUM_CLASSES logits); a few hundred steps on a CPU take
about a second. What it leaves in --out: model.onnx (what is served), model.pt (the trained weights, which
infer.py compares the served answers with).

Inside a GPUYARD job, `gpuyard.publish_model` authenticates with the job's own publish token: nothing to type.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings
import zlib
from pathlib import Path

import torch
from torch import nn

FEATURES = 16
HIDDEN = 64
NUM_CLASSES = 4
INPUT, OUTPUT = "features", "logits"  # the served model's tensor names


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, NUM_CLASSES))


def make_data(samples: int, seed: int, split: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
    """`samples` labelled points of the task `seed` (the centres), drawn for `split` (train, test…)."""
    centres = torch.randn(NUM_CLASSES, FEATURES, generator=torch.Generator().manual_seed(seed)) * 1.5
    generator = torch.Generator().manual_seed(zlib.crc32(f"{seed}/{split}".encode()))
    labels = torch.randint(0, NUM_CLASSES, (samples,), generator=generator)
    points = centres[labels] + torch.randn(samples, FEATURES, generator=generator)
    return points, labels


def train(steps: int, seed: int) -> tuple[nn.Module, float]:
    torch.manual_seed(seed)
    model = make_model()
    points, labels = make_data(4096, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(1, steps + 1):
        batch = torch.randint(0, len(points), (128,))
        optimizer.zero_grad()
        loss = loss_fn(model(points[batch]), labels[batch])
        loss.backward()
        optimizer.step()
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="blobs", help="the model's name (default: blobs)")
    parser.add_argument("--steps", type=int, default=300, help="training steps (default: 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the data and the weights (default: 0)")
    parser.add_argument("--out", type=Path, default=Path("train-and-serve-out"), help="where to write")
    parser.add_argument("--gpus", type=float, default=0.25, help="the deployment's GPU share (default 0.25)")
    parser.add_argument("--no-serve", action="store_true", help="publish only, deploy nothing")
    args = parser.parse_args(argv)

    model, accuracy = train(args.steps, args.seed)
    print(f"held-out accuracy: {accuracy:.3f}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), args.out / "model.pt")
    export(model, args.out / "model.onnx")
    print(f"exported {args.out / 'model.onnx'}", flush=True)

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
