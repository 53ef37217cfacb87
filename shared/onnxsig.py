"""The signature of an ONNX model: its inputs and outputs, each with its name, its Open Inference Protocol
datatype and its shape (-1 for a dynamic dimension), read from the graph with the `onnx` package alone (no
ONNX Runtime: the submit service reads it when a model is published).

A file that is not a valid, self-contained ONNX model is refused with the reason (`InvalidModel`)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.events import TensorSpec

# onnx.TensorProto.DataType -> the Open Inference Protocol's name (the numbers are the ONNX IR's, fixed)
V2_DATATYPE = {
    1: "FP32",  # FLOAT
    2: "UINT8",
    3: "INT8",
    4: "UINT16",
    5: "INT16",
    6: "INT32",
    7: "INT64",
    8: "BYTES",  # STRING
    9: "BOOL",
    10: "FP16",  # FLOAT16
    11: "FP64",  # DOUBLE
    12: "UINT32",
    13: "UINT64",
    16: "BF16",  # BFLOAT16
}


class InvalidModel(ValueError):
    """Not a model GPUYARD can publish; the message says why."""


@dataclass(frozen=True)
class Signature:
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]


def _tensor(value_info, role: str) -> TensorSpec:
    name = value_info.name
    kind = value_info.type.WhichOneof("value")
    if kind != "tensor_type":
        raise InvalidModel(f"{role} {name!r} is a {kind or 'value of no type'}, not a tensor")
    tensor = value_info.type.tensor_type
    datatype = V2_DATATYPE.get(tensor.elem_type)
    if datatype is None:
        raise InvalidModel(f"{role} {name!r} has an element type ({tensor.elem_type}) with no v2 datatype")
    if not tensor.HasField("shape"):
        raise InvalidModel(f"{role} {name!r} has no shape (its rank is unknown): export it with one")
    shape = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in tensor.shape.dim]
    return TensorSpec(name=name, datatype=datatype, shape=shape)


def read_signature(data: bytes) -> Signature:
    """The inputs (less the initializers, which older exporters list among them) and outputs of the ONNX
    model in `data`. Raises InvalidModel."""
    import onnx  # (a second's import: only when a model is read)
    from google.protobuf.message import DecodeError

    if not data:
        raise InvalidModel("the file is empty")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InvalidModel(f"not an ONNX model: {exc or 'it cannot be parsed'}") from None
    if model.ir_version <= 0 or not model.HasField("graph"):
        raise InvalidModel("not an ONNX model: no IR version or no graph")
    graph = model.graph
    external = onnx.TensorProto.EXTERNAL
    if any(t.data_location == external for t in graph.initializer):
        raise InvalidModel("the model keeps tensors in external data files: publish a single-file model")
    try:
        onnx.checker.check_model(model)
    except (onnx.checker.ValidationError, ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InvalidModel(f"not a valid ONNX model: {first}") from None
    initializers = {t.name for t in graph.initializer}
    inputs = [_tensor(v, "input") for v in graph.input if v.name not in initializers]
    outputs = [_tensor(v, "output") for v in graph.output]
    if not outputs:
        raise InvalidModel("the graph has no output")
    return Signature(inputs, outputs)
