"""The Open Inference Protocol v2 over HTTP ("KServe v2", what Triton speaks): its datatypes and their numpy
dtypes, the inference request and response bodies, and the binary tensor data extension.

A request body is JSON, optionally followed by raw tensors: the `Inference-Header-Content-Length` header then
gives the JSON's length, and each binary input carries `parameters.binary_data_size`; the tensors follow in
the order of the inputs, little-endian and row-major, BOOL one byte each, BYTES a 4-byte little-endian length
then the bytes for each element. A response does the same for the outputs that are asked binary
(`binary_data_output` on the request for all, `binary_data` on one requested output for that one).

The hot path is hand-parsed (`decode_request`, `encode_response`): pydantic describes the metadata answers,
which are not on it. Every malformed body raises `BadRequest` with the reason, never anything else."""

from __future__ import annotations

import json
import math
import struct
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from pydantic import BaseModel

from gpuyard.services.serving.errors import BadRequest

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
    "BYTES": np.dtype(object),
}
"""The 13 datatypes of the protocol and the numpy dtype of their elements (BYTES: an object array of bytes)."""

_INTEGER_RANGE = {name: np.iinfo(dtype) for name, dtype in DATATYPES.items() if dtype.kind in "iu"}
_LITTLE = sys.byteorder == "little"
_decode_json = json.JSONDecoder().decode
_encode_json = json.JSONEncoder(separators=(",", ":")).encode
"""`json.loads` and `json.dumps` without their per-call argument handling (json.dumps with any option builds a
new encoder on every call): a few microseconds a request on the hot path."""


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """An input or output of a model: `shape` has -1 for a dimension of any size."""

    name: str
    datatype: str
    shape: tuple[int, ...]

    def metadata(self) -> dict:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary: bool | None = None
    """Its own `binary_data` parameter; None: the request's `binary_data_output` decides."""


@dataclass(slots=True)
class InferRequest:
    inputs: dict[str, np.ndarray]
    """Name -> the tensor, shaped as the request says, with the datatype's dtype."""
    datatypes: dict[str, str]
    outputs: list[RequestedOutput] | None = None
    """None: every output of the model."""
    binary_output: bool = False
    id: str | None = None
    parameters: dict = field(default_factory=dict)


# --- the metadata answers (not on the hot path) ---------------------------------------------------------


class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int]


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]


class ModelMetadata(BaseModel):
    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


class RepositoryEntry(BaseModel):
    name: str
    version: str
    state: str
    reason: str = ""


# --- how large a request can be ------------------------------------------------------------------------

JSON_CHARS: dict[str, int] = {
    "BOOL": 5,  # false
    "UINT8": 3,
    "INT8": 4,
    "UINT16": 5,
    "INT16": 6,
    "UINT32": 10,
    "INT32": 11,
    "UINT64": 20,
    "INT64": 20,  # -9223372036854775808
    "FP16": 24,  # -1.7976931348623157e+308, the longest float Python's json writes
    "FP32": 24,
    "FP64": 24,
}
"""The longest JSON text of one element of each datatype. BYTES has none (a string of any length)."""
JSON_SLACK = 2
"""A factor on the JSON text of the data: whitespace, other writers' longer numbers."""
HEADER_ALLOWANCE = 64 * 1024
"""The request's JSON besides its tensors' data: id, names, shapes, parameters, the outputs asked for."""


class Signed(Protocol):
    """A tensor of a model's signature: `TensorSpec` here, or `gpuyard.shared.contracts.events.models.TensorSpec` (what
    `gpuyard.shared.modelfiles.signature` read when the model was published)."""

    @property
    def datatype(self) -> str: ...

    @property
    def shape(self) -> Sequence[int]: ...


def body_limit(inputs: Iterable[Signed], max_rows: int, cap: int) -> int:
    """The most bytes an inference request to a model with these inputs can need, at most `max_rows` rows on a
    dynamic first dimension, written in JSON (each element at its datatype's longest, its separator and
    brackets, times `JSON_SLACK`; the binary extension needs less) plus `HEADER_ALLOWANCE`; never above `cap`.
    `cap` itself when the inputs do not bound it: a BYTES input, or a dynamic dimension past the first."""
    total = HEADER_ALLOWANCE
    for spec in inputs:
        chars = JSON_CHARS.get(spec.datatype)
        shape = list(spec.shape)
        if chars is None or any(d < 0 for d in shape[1:]):
            return cap
        rows = (max_rows if shape[0] < 0 else shape[0]) if shape else 1
        elements = rows * math.prod(shape[1:])
        total += elements * (chars + 2 + 2 * len(shape)) * JSON_SLACK  # ", " and up to a bracket pair a dim
        if total >= cap:
            return cap
    return total


# --- requests -------------------------------------------------------------------------------------------


def decode_request(body: bytes, header_length: str | None) -> InferRequest:
    """Parse an inference request body: JSON alone, or JSON then the binary inputs when `header_length` (the
    `Inference-Header-Content-Length` header) is given."""
    json_end = _json_end(body, header_length)
    try:
        request = _decode_json((body[:json_end] if json_end != len(body) else body).decode())
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request's JSON is malformed: {exc}") from None
    if not isinstance(request, dict):
        raise BadRequest("the request must be a JSON object")
    raw_inputs = request.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise BadRequest("the request has no 'inputs' list")
    parameters = _object(request.get("parameters"), "the request's 'parameters'")
    if "classification" in parameters:
        raise BadRequest("the classification extension is not supported")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise BadRequest("parameter 'binary_data_output' must be a boolean")
    inputs, datatypes = _decode_inputs(raw_inputs, body, json_end)
    outputs = _requested_outputs(request["outputs"]) if "outputs" in request else None
    request_id = request.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise BadRequest("'id' must be a string")
    return InferRequest(inputs, datatypes, outputs, binary_output, request_id, parameters)


def _json_end(body: bytes, header_length: str | None) -> int:
    """Where the body's JSON ends: its end, or where `Inference-Header-Content-Length` says."""
    if header_length is None:
        return len(body)
    try:
        json_end = int(header_length)
    except ValueError:
        raise BadRequest(f"Inference-Header-Content-Length is not a number: {header_length!r}") from None
    if not 0 <= json_end <= len(body):
        raise BadRequest(f"Inference-Header-Content-Length is {json_end} but the body has {len(body)} bytes")
    return json_end


def _decode_inputs(
    raw_inputs: list, body: bytes, offset: int
) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The request's input tensors (name -> array) and their datatypes: from their JSON `data`, or from the
    binary part of the body, which starts at `offset` and must be used up exactly."""
    view = memoryview(body)
    inputs: dict[str, np.ndarray] = {}
    datatypes: dict[str, str] = {}
    for raw in raw_inputs:
        name, datatype, shape, input_parameters = _tensor_header(raw)
        if name in inputs:
            raise BadRequest(f"input '{name}' is given twice")
        size = input_parameters.get("binary_data_size")
        if size is not None:
            _check_binary_size(raw, name, size, len(body) - offset)
            inputs[name] = from_binary(view[offset : offset + size], datatype, shape, name)
            offset += size
        elif "data" in raw:
            inputs[name] = from_json(raw["data"], datatype, shape, name)
        else:
            raise BadRequest(f"input '{name}' has neither 'data' nor 'binary_data_size'")
        datatypes[name] = datatype
    if offset != len(body):
        raise BadRequest(f"{len(body) - offset} bytes of the body follow the last binary input")
    return inputs, datatypes


def _check_binary_size(raw: dict, name: str, size, left: int) -> None:
    if "data" in raw:
        raise BadRequest(f"input '{name}' has both 'data' and 'binary_data_size'")
    if type(size) is not int or size < 0:
        raise BadRequest(f"input '{name}': binary_data_size must be a non-negative integer")
    if size > left:
        raise BadRequest(
            f"input '{name}': binary_data_size is {size} but only {left} bytes are left in the body (truncated?)"
        )


def _requested_outputs(raw_outputs) -> list[RequestedOutput]:
    """The request's `outputs`: each a name and, when it says, whether it is wanted binary."""
    if not isinstance(raw_outputs, list):
        raise BadRequest("'outputs' must be a list")
    outputs = []
    for raw in raw_outputs:
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
            raise BadRequest("each requested output needs a 'name'")
        output_parameters = _object(raw.get("parameters"), "output '{}' parameters", raw["name"])
        if "classification" in output_parameters:
            raise BadRequest("the classification extension is not supported")
        binary = output_parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise BadRequest(f"output '{raw['name']}': binary_data must be a boolean")
        outputs.append(RequestedOutput(raw["name"], binary))
    return outputs


def _object(value, what: str, name: str = "") -> dict:
    """`value` when it is a JSON object ({} for none); BadRequest naming `what` (formatted with `name`) else."""
    if type(value) is dict:
        return value
    if value is None:
        return {}
    raise BadRequest(f"{what.format(name)} must be a JSON object")


def _tensor_header(raw) -> tuple[str, str, tuple[int, ...], dict]:
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise BadRequest("each input needs a 'name'")
    name = raw["name"]
    datatype = raw.get("datatype")
    if datatype not in DATATYPES:
        raise BadRequest(f"input '{name}': unknown datatype {datatype!r} (one of {', '.join(DATATYPES)})")
    shape = raw.get("shape")
    if type(shape) is not list or any(type(d) is not int or d < 0 for d in shape):
        raise BadRequest(f"input '{name}': shape must be a list of non-negative integers, not {shape!r}")
    return name, datatype, tuple(shape), _object(raw.get("parameters"), "input '{}' parameters", name)


def from_binary(chunk: memoryview, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A tensor from its raw bytes in the binary extension's layout."""
    count = math.prod(shape)
    if datatype == "BYTES":
        return decode_bytes(chunk, count, name).reshape(shape)
    dtype = DATATYPES[datatype]
    if len(chunk) != count * dtype.itemsize:
        raise BadRequest(
            f"input '{name}': {len(chunk)} bytes given, shape {list(shape)} of {datatype} needs "
            f"{count * dtype.itemsize}"
        )
    if datatype == "BOOL":
        return (np.frombuffer(chunk, np.uint8) != 0).reshape(shape)
    return np.frombuffer(chunk, dtype).reshape(shape)


def decode_bytes(chunk: memoryview, count: int, name: str) -> np.ndarray:
    """BYTES elements: each a 4-byte little-endian length, then that many bytes."""
    out = np.empty(count, dtype=object)
    offset, end = 0, len(chunk)
    for i in range(count):
        if offset + 4 > end:
            raise BadRequest(f"input '{name}': BYTES data ends after {i} of {count} elements")
        (length,) = struct.unpack_from("<I", chunk, offset)
        offset += 4
        if offset + length > end:
            raise BadRequest(f"input '{name}': BYTES element {i} is cut short")
        out[i] = bytes(chunk[offset : offset + length])
        offset += length
    if offset != end:
        raise BadRequest(f"input '{name}': {end - offset} bytes follow the last of {count} BYTES elements")
    return out


def encode_bytes(array: np.ndarray) -> bytes:
    parts: list[bytes] = []
    for item in array.ravel():
        data = item.encode() if isinstance(item, str) else bytes(item)
        parts += (struct.pack("<I", len(data)), data)
    return b"".join(parts)


def from_json(data, datatype: str, shape: tuple[int, ...], name: str) -> np.ndarray:
    """A tensor from JSON `data`, nested or flat, row-major. Elements must be of the datatype's kind
    (numbers for numbers, booleans for BOOL, strings for BYTES) and integers within the datatype's range."""
    count = math.prod(shape)
    if not isinstance(data, list):
        data = [data]
    if datatype == "BYTES":
        return _bytes_from_json(data, count, shape, name)
    try:
        array = np.asarray(data)
    except ValueError:
        raise BadRequest(f"input '{name}': the nested data is ragged") from None
    if array.size != count:
        raise BadRequest(f"input '{name}': {array.size} elements given, shape {list(shape)} holds {count}")
    if count:
        kind = array.dtype.kind
        if kind in "fO" and datatype in _INTEGER_RANGE and all(type(v) is int for v in _flatten(data)):
            try:  # integers beyond INT64's range, which numpy reads as floats or objects
                return np.array(_flatten(data), dtype=DATATYPES[datatype]).reshape(shape)
            except OverflowError:
                raise BadRequest(f"input '{name}': a value is out of {datatype}'s range") from None
        _check_elements(array, datatype, name)
    return array.astype(DATATYPES[datatype], copy=False).reshape(shape)


def _bytes_from_json(data: list, count: int, shape: tuple[int, ...], name: str) -> np.ndarray:
    flat = _flatten(data)
    if len(flat) != count:
        raise BadRequest(f"input '{name}': {len(flat)} elements given, shape {list(shape)} holds {count}")
    out = np.empty(count, dtype=object)
    for i, item in enumerate(flat):
        if not isinstance(item, str):
            raise BadRequest(f"input '{name}': BYTES data must be strings, element {i} is {item!r}")
        out[i] = item.encode()
    return out.reshape(shape)


def _check_elements(array: np.ndarray, datatype: str, name: str) -> None:
    """BadRequest unless the elements numpy read are of the datatype's kind, and within its range."""
    kind = array.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise BadRequest(f"input '{name}': BOOL data must be true/false")
    elif kind not in "iu" + ("f" if datatype.startswith("FP") else ""):
        expected = "numbers" if datatype.startswith("FP") else "integers"
        raise BadRequest(f"input '{name}': {datatype} data must be {expected}")
    elif datatype in _INTEGER_RANGE:
        limits = _INTEGER_RANGE[datatype]
        if array.min() < limits.min or array.max() > limits.max:
            raise BadRequest(f"input '{name}': a value is out of {datatype}'s range")


def _flatten(data: list) -> list:
    if not any(isinstance(item, list) for item in data):
        return data
    flat: list = []
    for item in data:
        flat.extend(_flatten(item) if isinstance(item, list) else [item])
    return flat


# --- responses ------------------------------------------------------------------------------------------


def encode_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: list[tuple[str, str, np.ndarray, bool]],
) -> tuple[bytes, int | None]:
    """The response body for `outputs` (name, datatype, array, whether binary) and, when any is binary, the
    length of its JSON part for the `Inference-Header-Content-Length` header (else None)."""
    response: dict = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        response["id"] = request_id
    tensors = []
    chunks = []
    for name, datatype, array, binary in outputs:
        tensor: dict[str, object] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if binary:
            raw = to_binary(array, datatype)
            tensor["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            tensor["data"] = to_json(array, datatype, name)
        tensors.append(tensor)
    response["outputs"] = tensors
    header = _encode_json(response).encode()
    if not chunks:
        return header, None
    return b"".join([header, *chunks]), len(header)


def to_binary(array: np.ndarray, datatype: str) -> bytes:
    if datatype == "BYTES":
        return encode_bytes(array)
    dtype = DATATYPES[datatype]
    if array.dtype != dtype or not _LITTLE:
        array = array.astype(dtype)
    return array.tobytes()  # C order, whatever the array's strides


def to_json(array: np.ndarray, datatype: str, name: str) -> list:
    if datatype != "BYTES":
        return array.ravel().tolist()
    try:
        return [item.decode() if isinstance(item, bytes) else str(item) for item in array.ravel()]
    except UnicodeDecodeError:
        raise BadRequest(f"output '{name}' is not UTF-8 text: ask for it with binary_data") from None


def error_body(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
