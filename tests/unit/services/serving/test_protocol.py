"""The v2 codec on its own: bodies built the way tritonclient builds them (its own serializers), every
datatype in binary and JSON, and each malformed body refused with a reason."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor

from gpuyard.services.serving.errors import BadRequest
from gpuyard.services.serving.protocol import DATATYPES, decode_request, encode_response

RNG = np.random.default_rng(7)


def sample(datatype: str, shape=(2, 3)) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([f"é{i}".encode() + bytes([i]) for i in range(6)], dtype=object).reshape(shape)
    if datatype == "BOOL":
        return RNG.integers(0, 2, shape).astype(bool)
    dtype = DATATYPES[datatype]
    if dtype.kind == "f":
        return RNG.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)


def binary_body(tensors: dict[str, np.ndarray], **request) -> tuple[bytes, str]:
    """A request as tritonclient sends it: JSON, then each tensor's raw bytes."""
    inputs, raw = [], []
    for name, array in tensors.items():
        datatype = np_to_triton_dtype(array.dtype)
        data = serialize_byte_tensor(array).item() if datatype == "BYTES" else array.tobytes()
        inputs.append(
            {
                "name": name,
                "shape": list(array.shape),
                "datatype": datatype,
                "parameters": {"binary_data_size": len(data)},
            }
        )
        raw.append(data)
    header = json.dumps({"inputs": inputs, **request}).encode()
    return header + b"".join(raw), str(len(header))


@pytest.mark.parametrize("datatype", list(DATATYPES))
def test_every_datatype_comes_through_binary_both_ways(datatype):
    array = sample(datatype)
    body, length = binary_body({"t": array})
    request = decode_request(body, length)
    assert request.datatypes == {"t": datatype}
    got = request.inputs["t"]
    assert got.shape == array.shape and got.dtype == DATATYPES[datatype]
    assert np.array_equal(got, array)

    content, json_length = encode_response("m", "1", "abc", [("t", datatype, got, True)])
    header = json.loads(content[:json_length])
    assert header["id"] == "abc" and header["model_version"] == "1"
    (output,) = header["outputs"]
    assert output["parameters"]["binary_data_size"] == len(content) - json_length
    raw = content[json_length:]
    if datatype == "BYTES":
        back = deserialize_bytes_tensor(raw).reshape(output["shape"])
    else:
        back = np.frombuffer(raw, DATATYPES[datatype]).reshape(output["shape"])
    assert np.array_equal(back, array)


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d != "BYTES"])
def test_every_datatype_comes_through_json_nested_or_flat(datatype):
    array = sample(datatype)
    for data in (array.tolist(), array.ravel().tolist()):
        body = json.dumps({"inputs": [{"name": "t", "shape": [2, 3], "datatype": datatype, "data": data}]})
        got = decode_request(body.encode(), None).inputs["t"]
        assert got.dtype == DATATYPES[datatype] and np.array_equal(got, array)
    content, json_length = encode_response("m", "1", None, [("t", datatype, array, False)])
    assert json_length is None
    (output,) = json.loads(content)["outputs"]
    assert output["shape"] == [2, 3] and np.array_equal(
        np.array(output["data"], DATATYPES[datatype]), array.ravel()
    )


def test_bytes_in_json_are_utf8_strings():
    body = json.dumps({"inputs": [{"name": "t", "shape": [2], "datatype": "BYTES", "data": ["a", "é"]}]})
    got = decode_request(body.encode(), None).inputs["t"]
    assert got.tolist() == [b"a", "é".encode()]
    content, _ = encode_response("m", "1", None, [("t", "BYTES", got, False)])
    assert json.loads(content)["outputs"][0]["data"] == ["a", "é"]
    with pytest.raises(BadRequest, match="not UTF-8"):
        encode_response("m", "1", None, [("t", "BYTES", np.array([b"\xff"], dtype=object), False)])


def test_binary_and_json_inputs_mix_and_binary_follows_the_inputs_order():
    a, b = sample("FP32"), sample("INT16")
    body, _ = binary_body({"a": a, "b": b})
    header_length = body.index(b"}]}") + 3
    request = json.loads(body[:header_length])
    # make the first input JSON: only the second one's bytes stay after the header
    request["inputs"][0].pop("parameters")
    request["inputs"][0]["data"] = a.tolist()
    header = json.dumps(request).encode()
    decoded = decode_request(header + b.tobytes(), str(len(header)))
    assert np.array_equal(decoded.inputs["a"], a) and np.array_equal(decoded.inputs["b"], b)


def test_output_choices_and_request_parameters():
    body, length = binary_body(
        {"t": sample("FP32")},
        outputs=[{"name": "y", "parameters": {"binary_data": False}}, {"name": "z"}],
        parameters={"binary_data_output": True, "priority": 3, "something_new": "x"},
        id="r1",
    )
    request = decode_request(body, length)
    assert request.binary_output is True and request.id == "r1"
    assert [(o.name, o.binary) for o in request.outputs] == [("y", False), ("z", None)]


def test_bool_bytes_other_than_one_read_as_true():
    header = json.dumps(
        {"inputs": [{"name": "t", "shape": [3], "datatype": "BOOL", "parameters": {"binary_data_size": 3}}]}
    )
    got = decode_request(header.encode() + b"\x00\x01\x07", str(len(header))).inputs["t"]
    assert got.tolist() == [False, True, True]


def _one(datatype="FP32", shape=(2, 2), **extra) -> dict:
    return {"inputs": [{"name": "t", "shape": list(shape), "datatype": datatype, **extra}]}


BAD_BODIES = [
    ("not json", b"{inputs", None, "malformed"),
    ("not an object", b"[1, 2]", None, "JSON object"),
    ("no inputs", b'{"inputs": []}', None, "no 'inputs'"),
    ("unknown datatype", json.dumps(_one("FP8", data=[1, 2, 3, 4])).encode(), None, "unknown datatype"),
    ("negative dim", json.dumps(_one(shape=(-1, 2), data=[1, 2])).encode(), None, "non-negative"),
    ("no data", json.dumps(_one()).encode(), None, "neither"),
    ("too few", json.dumps(_one(data=[1, 2, 3])).encode(), None, "3 elements given"),
    ("ragged", json.dumps(_one(data=[[1, 2], [3]])).encode(), None, "ragged"),
    ("strings as floats", json.dumps(_one(data=["1", "2", "3", "4"])).encode(), None, "numbers"),
    ("floats as ints", json.dumps(_one("INT32", data=[1.5, 2, 3, 4])).encode(), None, "integers"),
    ("out of range", json.dumps(_one("UINT8", data=[1, 2, 3, 256])).encode(), None, "range"),
    ("beyond UINT64", json.dumps(_one("UINT64", data=[1, 2, 3, 2**64])).encode(), None, "range"),
    ("negative UINT64", json.dumps(_one("UINT64", data=[1, 2, 3, -1])).encode(), None, "range"),
    ("numbers as bool", json.dumps(_one("BOOL", data=[1, 0, 1, 0])).encode(), None, "true/false"),
    (
        "classification",
        json.dumps(
            {**_one(data=[1, 2, 3, 4]), "outputs": [{"name": "y", "parameters": {"classification": 2}}]}
        ).encode(),
        None,
        "classification",
    ),
    ("header too long", b'{"inputs": []}', "999", "body has"),
    ("header not a number", b'{"inputs": []}', "ten", "not a number"),
]


@pytest.mark.parametrize(
    ("body", "length", "reason"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
def test_malformed_bodies_are_refused_with_a_reason(body, length, reason):
    with pytest.raises(BadRequest, match=reason):
        decode_request(body, length)


def test_binary_sizes_that_do_not_add_up_are_refused():
    array = sample("FP32")
    body, length = binary_body({"t": array})
    with pytest.raises(BadRequest, match="truncated"):
        decode_request(body[:-1], length)
    with pytest.raises(BadRequest, match="follow the last binary input"):
        decode_request(body + b"\x00", length)
    wrong = body.replace(b'"binary_data_size": 24', b'"binary_data_size": 20')
    with pytest.raises(BadRequest, match="20 bytes given"):
        decode_request(wrong[:-4], length)


def test_bytes_elements_cut_short_are_refused():
    array = sample("BYTES")
    body, length = binary_body({"t": array})
    size = len(serialize_byte_tensor(array).item())
    short = body.replace(f'"binary_data_size": {size}'.encode(), f'"binary_data_size": {size - 1}'.encode())
    with pytest.raises(BadRequest, match="cut short"):
        decode_request(short[:-1], length)
