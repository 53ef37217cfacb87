"""NVIDIA Triton Inference Server (the `tritonserver` binary that PyTriton bundles) serving an ONNX Runtime session
through a PyTriton-bound Python function, for benchmarks/serving.py. Run with PyTriton's own virtual environment:

    python benchmarks/serving_peers/triton_server.py --model mlp.onnx --name mlp --port 8000

Triton answers /v2/models/NAME/infer itself (v2 JSON and the binary tensor extension; HTTP only, no gRPC, no
metrics). PyTriton's layout: Triton's Python backend hands each request to this process (shared memory, then
ZeroMQ), where `infer` runs the session; one model instance, no dynamic batching (as the other peers, and as the
unbatched GPUYard row). PyTriton starts `tritonserver` with no model and then loads this one: `/v2/health/ready`
answers 200 before the model is there, `/v2/models/NAME/ready` once it is. The process stays up until it is
signalled; `tritonserver` and the Python backend's stub end with it."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

import numpy as np
from common import ort_session, server_arguments
from pytriton.model_config import ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig


def infer_function(session):
    """PyTriton's callable: a list of requests (each its input arrays by name) in, their outputs out."""
    names = [output.name for output in session.get_outputs()]

    def infer(requests):
        return [dict(zip(names, session.run(names, dict(request)), strict=True)) for request in requests]

    return infer


def tensors(arguments) -> list[Tensor]:
    """ONNX Runtime's inputs or outputs as Triton tensors: FP32, a named (free) dimension as -1."""
    return [
        Tensor(
            name=t.name,
            dtype=np.float32,
            shape=tuple(-1 if isinstance(d, str) or d is None else d for d in t.shape),
        )
        for t in arguments
    ]


if __name__ == "__main__":
    args = server_arguments(__doc__)
    logging.basicConfig(level=logging.WARNING)
    session = ort_session(args.model)
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=args.port,
        allow_grpc=False,
        allow_metrics=False,
        allow_gpu_metrics=False,
        allow_cpu_metrics=False,
        log_verbose=0,
    )
    # PyTriton copies tritonserver into its workspace: next to the model (benchmarks/serving.py's temporary
    # folder), so that a server killed before it could clean up leaves nothing behind the benchmark
    workspace = Path(args.model).resolve().parent / f"pytriton-{args.name}-{args.port}"
    with Triton(config=config, workspace=workspace) as triton:
        triton.bind(
            model_name=args.name,
            infer_func=infer_function(session),
            inputs=tensors(session.get_inputs()),
            outputs=tensors(session.get_outputs()),
            config=ModelConfig(batching=False),
        )
        triton.run()  # a SIGTERM before the model is loaded ends the process at once (Python's default)
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        print("ready", flush=True)
        stop.wait()
