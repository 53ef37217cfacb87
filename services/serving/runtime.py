"""One ONNX model in ONNX Runtime: the artifact's checksum verified before loading, the session on the CUDA
provider when it is available and a GPU is given (else the CPU), the model's inputs and outputs read from the
session, and `run`.

onnxruntime is an extra (`gpuyard[serving]`, or `onnxruntime-gpu` through `gpuyard[gpu]`), so it is imported
only when a model is loaded."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from gpuyard.services.serving.errors import BadRequest, ModelLoadError, ServingError
from gpuyard.services.serving.protocol import TensorSpec

ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}
"""ONNX Runtime's type names -> the protocol's datatypes. BYTES reach ONNX Runtime as UTF-8 text (a string
tensor holds text, not bytes)."""

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _spec(arg) -> TensorSpec:
    datatype = ORT_TYPES.get(arg.type)
    if datatype is None:
        raise ModelLoadError(f"{arg.name} has type {arg.type}, which the protocol cannot carry")
    shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or ()))
    return TensorSpec(arg.name, datatype, shape)


class Session(Protocol):
    """What a model runs in: an ONNX Runtime `InferenceSession`."""

    def run(self, output_names: list[str], input_feed: dict[str, Any]) -> list[Any]: ...


@dataclass(eq=False)
class OnnxModel:
    """A loaded model. `run` may be called from several threads at once (ONNX Runtime's `Run` is
    thread-safe and releases the GIL)."""

    session: Session
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    provider: str
    """The execution provider the session actually uses: CUDAExecutionProvider or CPUExecutionProvider."""
    sha256: str | None = None
    intra_op_threads: int = 1
    """ONNX Runtime's threads per run; with one, a run computes in the thread that calls it."""
    runs: int = 0
    """`session.run` calls so far (a batch is one)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def batchable(self) -> bool:
        """Whether requests may be stacked along the first dimension: every input and output has a first
        dimension, and it is of any size."""
        specs = [*self.inputs.values(), *self.outputs.values()]
        return all(spec.shape and spec.shape[0] == -1 for spec in specs)

    def run(self, feeds: dict[str, np.ndarray], outputs: list[str] | None = None) -> dict[str, np.ndarray]:
        """The model's outputs (all, or those named) for `feeds` (checked against `inputs` beforehand)."""
        names = outputs or list(self.outputs)
        feeds = {
            name: _text(array, name) if self.inputs[name].datatype == "BYTES" else array
            for name, array in feeds.items()
        }
        with self._lock:
            self.runs += 1
        try:
            results = self.session.run(names, feeds)
        except Exception as exc:  # onnxruntime's own exception classes, which it does not export
            if type(exc).__name__ == "InvalidArgument":
                raise BadRequest(f"the model refused the inputs: {exc}") from None
            raise ServingError(f"the model failed: {exc}") from None
        return dict(zip(names, results, strict=True))


def _text(array: np.ndarray, name: str) -> np.ndarray:
    try:
        return np.vectorize(lambda b: b.decode() if isinstance(b, bytes) else b, otypes=[object])(array)
    except UnicodeDecodeError:
        raise BadRequest(f"input '{name}' is not UTF-8 text, which an ONNX string tensor needs") from None


def load_onnx(
    artifact: Path | str | bytes,
    *,
    sha256: str | None = None,
    gpu: int | None = None,
    intra_op_threads: int = 1,
) -> OnnxModel:
    """Load an ONNX model (a file, or its bytes) into an ONNX Runtime session.

    `sha256`: the artifact's expected checksum, verified before loading. `gpu`: the index of the GPU to run
    on, used when the CUDA provider is available (the CPU otherwise). Raises ModelLoadError with the reason
    when the artifact cannot be served."""
    import onnxruntime

    if isinstance(artifact, bytes):
        actual = hashlib.sha256(artifact).hexdigest()
    else:
        artifact = Path(artifact)
        try:
            actual = sha256_of(artifact)
        except OSError as exc:
            raise ModelLoadError(f"cannot read {artifact}: {exc}") from None
        artifact = str(artifact)
    if sha256 is not None and actual != sha256.lower():
        raise ModelLoadError(f"sha256 mismatch: expected {sha256}, the artifact has {actual}")

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3  # errors only: a warning per unused initializer is noise here
    providers: list = [CPU]
    if gpu is not None and CUDA in onnxruntime.get_available_providers():
        providers = [(CUDA, {"device_id": gpu}), CPU]
    try:
        session = onnxruntime.InferenceSession(artifact, sess_options=options, providers=providers)
    except Exception as exc:  # onnxruntime raises its own unexported classes (InvalidProtobuf, Fail, …)
        raise ModelLoadError(f"ONNX Runtime cannot load the model: {exc}") from None
    inputs = {arg.name: _spec(arg) for arg in session.get_inputs()}
    outputs = {arg.name: _spec(arg) for arg in session.get_outputs()}
    return OnnxModel(session, inputs, outputs, session.get_providers()[0], actual, intra_op_threads)


def check_inputs(model: OnnxModel, given: dict[str, np.ndarray], datatypes: dict[str, str]) -> None:
    """BadRequest unless `given` are exactly the model's inputs, each of its datatype and a shape it takes."""
    for name, array in given.items():
        spec = model.inputs.get(name)
        if spec is None:
            raise BadRequest(f"unknown input '{name}': the model takes {', '.join(model.inputs)}")
        if datatypes[name] != spec.datatype:
            raise BadRequest(f"input '{name}' is {datatypes[name]}, the model takes {spec.datatype}")
        if len(array.shape) != len(spec.shape) or any(
            want not in (-1, got) for want, got in zip(spec.shape, array.shape, strict=True)
        ):
            raise BadRequest(
                f"input '{name}' has shape {list(array.shape)}, the model takes {list(spec.shape)}"
            )
    if len(given) != len(model.inputs):
        missing = [name for name in model.inputs if name not in given]
        raise BadRequest(f"missing input {', '.join(repr(n) for n in missing)}")
