"""What every server of benchmarks/serving.py shares, GPUYard's aside: the ONNX Runtime session (one intra-op
thread, as GPUYard's `load_onnx` makes it) and the Open Inference Protocol v2 JSON in and out, written the plain
way (json, numpy) so that each server does the same JSON work around `session.run`.

Imported by the peers' servers in their own virtual environments: numpy and onnxruntime only."""

from __future__ import annotations

import argparse
import json

import numpy as np

DTYPES = {"FP32": np.float32, "FP64": np.float64, "INT64": np.int64, "INT32": np.int32}


def ort_session(path: str):
    """An ONNX Runtime session on the CPU with the options of GPUYard's `runtime.load_onnx`."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])


def v2_inputs(request: dict) -> dict[str, np.ndarray]:
    """The input arrays of a v2 JSON inference request (flat or nested `data`)."""
    return {
        tensor["name"]: np.asarray(tensor["data"], dtype=DTYPES[tensor["datatype"]]).reshape(tensor["shape"])
        for tensor in request["inputs"]
    }


def v2_response(model_name: str, outputs: dict[str, np.ndarray]) -> dict:
    """A v2 JSON inference response with every output's data flat."""
    return {
        "model_name": model_name,
        "outputs": [
            {"name": name, "datatype": "FP32", "shape": list(array.shape), "data": array.ravel().tolist()}
            for name, array in outputs.items()
        ],
    }


def infer_json(session, model_name: str, body: bytes) -> bytes:
    """The whole JSON round: request body -> arrays -> `session.run` -> response body."""
    feeds = v2_inputs(json.loads(body))
    names = [output.name for output in session.get_outputs()]
    results = session.run(names, feeds)
    return json.dumps(v2_response(model_name, dict(zip(names, results, strict=True)))).encode()


def server_arguments(description: str) -> argparse.Namespace:
    """--model PATH --name NAME --port PORT, which every peer server takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True, help="the ONNX file")
    parser.add_argument("--name", required=True, help="the model's name in /v2/models/NAME/infer")
    parser.add_argument("--port", type=int, required=True)
    return parser.parse_args()
