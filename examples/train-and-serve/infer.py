"""Ask the model that train.py deployed, through Triton's own client on the serving port (8000), and check its
answers against the trained PyTorch model's.

    python examples/train-and-serve/infer.py [--url 127.0.0.1:8000] [--name blobs] [--out train-and-serve-out]

It waits (up to --wait seconds) for the model to be ready, sends a batch of held-out points as binary tensors,
and prints the predicted classes, the accuracy and the largest difference from PyTorch's logits; it exits 1 when
they differ by more than --tolerance. The token is the CLI's (GPUYARD_TOKEN, or what `gpuyard up` saved).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import tritonclient.http as triton

from gpuyard.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train import INPUT, OUTPUT, make_data, make_model  # noqa: E402


def wait_ready(client: triton.InferenceServerClient, name: str, headers: dict, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while True:
        try:
            if client.is_model_ready(name, headers=headers):
                return
        except Exception:  # the serving port not open yet
            pass
        if time.monotonic() > deadline:
            raise SystemExit(
                f"model {name!r} not ready after {seconds:g}s: see gpuyard models describe {name}"
            )
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default="127.0.0.1:8000", help="the serving service (default 127.0.0.1:8000)"
    )
    parser.add_argument("--name", default="blobs", help="the model's name (default: blobs)")
    parser.add_argument("--out", type=Path, default=Path("train-and-serve-out"), help="train.py's --out")
    parser.add_argument(
        "--seed", type=int, default=0, help="train.py's --seed (the task its points are drawn from)"
    )
    parser.add_argument("--samples", type=int, default=8, help="points to send in one request (default 8)")
    parser.add_argument("--wait", type=float, default=60, help="seconds to wait for the model (default 60)")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest allowed difference")
    args = parser.parse_args(argv)

    headers = {"Authorization": f"Bearer {Client().token}"}
    client = triton.InferenceServerClient(args.url)
    wait_ready(client, args.name, headers, args.wait)

    points, labels = make_data(args.samples, args.seed, "infer")
    given = triton.InferInput(INPUT, list(points.shape), "FP32")
    given.set_data_from_numpy(points.numpy())  # binary, tritonclient's default
    answer = client.infer(args.name, [given], headers=dict(headers))  # (tritonclient adds to it)
    served = answer.as_numpy(OUTPUT)

    model = make_model()
    model.load_state_dict(torch.load(args.out / "model.pt"))
    model.eval()
    with torch.no_grad():
        expected = model(points).numpy()
    difference = float(np.abs(served - expected).max())
    predicted = served.argmax(1)
    accuracy = float((predicted == labels.numpy()).mean())
    version = answer.get_response()["model_version"]
    print(f"{args.name} version {version}: predicted {predicted.tolist()}, labels {labels.tolist()}")
    print(f"accuracy {accuracy:.3f}; largest difference from PyTorch {difference:.2e}")
    if difference > args.tolerance:
        print(f"the served model differs from PyTorch by more than {args.tolerance:g}", file=sys.stderr)
        return 1
    print("the served answers match PyTorch's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
