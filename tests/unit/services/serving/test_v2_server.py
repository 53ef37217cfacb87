"""The v2 app behind a real uvicorn server, called with tritonclient.http unchanged (binary by default, and
JSON) and with raw KServe v2 JSON through httpx. Outputs are checked against numpy, errors by status and
message, versions and the model repository extension by what the server then answers."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from gpuyard.services.serving.errors import Forbidden
from gpuyard.services.serving.registry import ModelRegistry, ModelSource, VersionState
from gpuyard.services.serving.runtime import load_onnx
from gpuyard.services.serving.v2app import create_app
from gpuyard.shared.contracts.version import VERSION

from .models import BROKEN, Mlp, doubler, half_to_double, text_echo, two_by_two, two_by_two_reference
from .server import serve

MLP_V1, MLP_V2 = Mlp(seed=1), Mlp(seed=2)
RNG = np.random.default_rng(11)


@pytest.fixture(scope="module")
def server():
    registry = ModelRegistry()
    registry.add("mlp", 1, load_onnx(MLP_V1.bytes))
    registry.add("mlp", 2, load_onnx(MLP_V2.bytes))
    registry.add("two", 1, load_onnx(two_by_two()))
    registry.add("text", 1, load_onnx(text_echo()))
    registry.add("half", 1, load_onnx(half_to_double()))
    registry.add("batched", 1, load_onnx(MLP_V1.bytes), max_batch_size=64, max_queue_delay_us=50_000)
    registry.add("widths", 1, load_onnx(doubler()), max_batch_size=64, max_queue_delay_us=50_000)

    def authorize(request, name):
        if name == "secret" and request.headers.get("authorization") != "Bearer open-sesame":
            raise Forbidden("this model is not yours")

    registry.add("secret", 1, load_onnx(MLP_V1.bytes))
    with serve(create_app(registry, authorize=authorize)) as running:
        running.registry = registry
        yield running
        running.call(registry.close())  # the batchers' workers end on the server's own loop


@pytest.fixture
def client(server):
    client = triton.InferenceServerClient(server.url)
    yield client
    client.close()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base, timeout=10) as client:
        yield client


def x_input(x: np.ndarray, binary: bool = True, name: str = "x") -> triton.InferInput:
    tensor = triton.InferInput(name, list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    return tensor


def floats(*shape) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


# --- health and metadata --------------------------------------------------------------------------------


def test_health_and_server_metadata(client, http):
    assert client.is_server_live() and client.is_server_ready()
    metadata = client.get_server_metadata()
    assert metadata["name"] == "gpuyard" and metadata["version"] == VERSION
    assert {"binary_tensor_data", "model_repository"} <= set(metadata["extensions"])
    assert http.get("/v2/health/live").status_code == 200


def test_model_metadata_and_readiness(client):
    metadata = client.get_model_metadata("two")
    assert metadata["platform"] == "onnx_onnxv1" and metadata["versions"] == ["1"]
    assert metadata["inputs"] == [
        {"name": "a", "datatype": "INT64", "shape": [-1, 3]},
        {"name": "mask", "datatype": "BOOL", "shape": [-1, 3]},
    ]
    assert [o["name"] for o in metadata["outputs"]] == ["kept", "flipped"]
    assert client.get_model_metadata("mlp")["versions"] == ["1", "2"]
    assert client.get_model_metadata("mlp", "1")["inputs"][0]["shape"] == [-1, 4]
    assert client.is_model_ready("mlp") and client.is_model_ready("mlp", "1")
    assert not client.is_model_ready("nope") and not client.is_model_ready("mlp", "9")


# --- inference through tritonclient ---------------------------------------------------------------------


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_tritonclient_infers_the_newest_version_by_default(client, server, binary):
    x = floats(3, 4)
    outputs = None if binary else [triton.InferRequestedOutput("y", binary_data=False)]
    result = client.infer("mlp", [x_input(x, binary)], outputs=outputs, request_id="r7")
    response = result.get_response()
    assert response["model_version"] == "2" and response["id"] == "r7"
    assert ("parameters" in response["outputs"][0]) is binary  # JSON mode: `data`, no binary part
    np.testing.assert_allclose(result.as_numpy("y"), MLP_V2(x), rtol=1e-5, atol=1e-5)
    older = client.infer("mlp", [x_input(x, binary)], model_version="1", outputs=outputs)
    np.testing.assert_allclose(older.as_numpy("y"), MLP_V1(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_int64_and_bool_inputs_and_outputs(client, binary):
    a = RNG.integers(-(2**40), 2**40, (4, 3))
    mask = RNG.integers(0, 2, (4, 3)).astype(bool)
    inputs = [triton.InferInput("a", [4, 3], "INT64"), triton.InferInput("mask", [4, 3], "BOOL")]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(mask, binary_data=binary)
    expected = two_by_two_reference(a, mask)
    both = client.infer("two", inputs)  # no outputs named: all of them, binary
    for name in ("kept", "flipped"):
        assert np.array_equal(both.as_numpy(name), expected[name])
        assert both.as_numpy(name).dtype == expected[name].dtype
    only = client.infer("two", inputs, outputs=[triton.InferRequestedOutput("flipped", binary_data=binary)])
    assert [o["name"] for o in only.get_response()["outputs"]] == ["flipped"]
    assert np.array_equal(only.as_numpy("flipped"), expected["flipped"]) and only.as_numpy("kept") is None


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_bytes_tensors(client, binary):
    text = np.array([b"hello", "gr\u00fc\u00dfe".encode(), b""], dtype=object)
    tensor = triton.InferInput("text", [3], "BYTES")
    tensor.set_data_from_numpy(text, binary_data=binary)
    result = client.infer("text", [tensor], outputs=[triton.InferRequestedOutput("same", binary_data=binary)])
    got = [item if isinstance(item, bytes) else item.encode() for item in result.as_numpy("same")]
    assert got == list(text)


def test_fp16_in_fp64_out_in_binary(client):
    h = RNG.standard_normal((5, 2)).astype(np.float16)
    tensor = triton.InferInput("h", [5, 2], "FP16")
    tensor.set_data_from_numpy(h)
    out = client.infer("half", [tensor]).as_numpy("d")
    assert out.dtype == np.float64 and np.array_equal(out, h.astype(np.float64))


def test_tritonclient_concurrent_requests_are_batched_and_split_back(server):
    model = server.registry.resolve("batched").model
    before = model.runs
    client = triton.InferenceServerClient(server.url, concurrency=8)
    try:
        requests = [floats(n, 4) for n in (1, 2, 3, 1, 2, 1, 1, 4)]
        pending = [client.async_infer("batched", [x_input(x)]) for x in requests]
        results = [p.get_result() for p in pending]
    finally:
        client.close()
    runs = model.runs - before
    assert 1 <= runs < len(requests)
    for x, result in zip(requests, results, strict=True):
        np.testing.assert_allclose(result.as_numpy("y"), MLP_V1(x), rtol=1e-5, atol=1e-5)


def test_concurrent_requests_of_different_shapes_are_not_mixed(server):
    model = server.registry.resolve("widths").model
    before = model.runs
    client = triton.InferenceServerClient(server.url, concurrency=8)
    try:
        requests = [floats(n, w) for n, w in [(1, 2), (2, 3), (1, 2), (2, 3), (1, 2), (1, 3), (2, 2), (1, 3)]]
        pending = [client.async_infer("widths", [x_input(x)]) for x in requests]
        results = [p.get_result() for p in pending]
    finally:
        client.close()
    for x, result in zip(requests, results, strict=True):
        np.testing.assert_array_equal(result.as_numpy("y"), 2 * x)
    assert model.runs - before < len(requests)


# --- raw KServe v2 JSON ---------------------------------------------------------------------------------


def test_kserve_v2_json_with_nested_data(http):
    x = floats(2, 4)
    body = {"id": "k1", "inputs": [{"name": "x", "shape": [2, 4], "datatype": "FP32", "data": x.tolist()}]}
    response = http.post("/v2/models/mlp/versions/1/infer", json=body)
    assert response.status_code == 200 and response.headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in response.headers
    answer = response.json()
    assert answer["model_name"] == "mlp" and answer["model_version"] == "1" and answer["id"] == "k1"
    (y,) = answer["outputs"]
    assert y["name"] == "y" and y["datatype"] == "FP32" and y["shape"] == [2, 3]
    np.testing.assert_allclose(np.array(y["data"]).reshape(2, 3), MLP_V1(x), rtol=1e-5, atol=1e-5)


def test_raw_binary_request_with_per_output_choice(http):
    a = RNG.integers(0, 100, (2, 3))
    mask = np.array([[True, False, True], [False, False, True]])
    header = json.dumps(
        {
            "inputs": [
                {"name": "a", "shape": [2, 3], "datatype": "INT64", "parameters": {"binary_data_size": 48}},
                {"name": "mask", "shape": [2, 3], "datatype": "BOOL", "data": mask.tolist()},
            ],
            "outputs": [{"name": "kept", "parameters": {"binary_data": True}}, {"name": "flipped"}],
            "parameters": {"unknown_to_us": 1, "priority": 0},
        }
    ).encode()
    response = http.post(
        "/v2/models/two/infer",
        content=header + a.astype("<i8").tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 200, response.text
    length = int(response.headers["inference-header-content-length"])
    answer = json.loads(response.content[:length])
    kept, flipped = answer["outputs"]
    assert kept["parameters"]["binary_data_size"] == 48 == len(response.content) - length
    assert np.array_equal(np.frombuffer(response.content[length:], "<i8").reshape(2, 3), np.where(mask, a, 0))
    assert flipped["data"] == (~mask).ravel().tolist()


# --- errors ---------------------------------------------------------------------------------------------


def mlp_body(**change) -> dict:
    tensor = {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0], **change}
    return {"inputs": [tensor]}


ERRORS = [
    ("unknown model", "/v2/models/nope/infer", mlp_body(), 404, "unknown model 'nope'"),
    ("unknown version", "/v2/models/mlp/versions/9/infer", mlp_body(), 404, "unknown version '9'"),
    ("version not a number", "/v2/models/mlp/versions/x/infer", mlp_body(), 404, "unknown version 'x'"),
    ("wrong input name", "/v2/models/mlp/infer", mlp_body(name="z"), 400, "unknown input 'z'"),
    (
        "wrong datatype",
        "/v2/models/mlp/infer",
        mlp_body(datatype="FP64"),
        400,
        "'x' is FP64, the model takes FP32",
    ),
    (
        "wrong shape",
        "/v2/models/mlp/infer",
        mlp_body(shape=[2, 2]),
        400,
        r"shape [2, 2], the model takes [-1, 4]",
    ),
    ("size mismatch", "/v2/models/mlp/infer", mlp_body(shape=[1, 5]), 400, "4 elements given"),
    (
        "unknown output",
        "/v2/models/mlp/infer",
        {**mlp_body(), "outputs": [{"name": "w"}]},
        400,
        "unknown output 'w'",
    ),
    ("malformed JSON", "/v2/models/mlp/infer", b'{"inputs": [', 400, "malformed"),
    ("no such route", "/v2/modelz", mlp_body(), 404, "Not Found"),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "reason"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_errors_are_json_with_the_reason(http, path, body, status, reason):
    response = http.post(path, **({"content": body} if isinstance(body, bytes) else {"json": body}))
    assert response.status_code == status
    assert reason in response.json()["error"]


def test_a_truncated_binary_body_is_400(http):
    header = json.dumps(
        {
            "inputs": [
                {"name": "x", "shape": [1, 4], "datatype": "FP32", "parameters": {"binary_data_size": 16}}
            ]
        }
    ).encode()
    response = http.post(
        "/v2/models/mlp/infer",
        content=header + b"\x00" * 12,
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert response.status_code == 400 and "truncated" in response.json()["error"]


def test_tritonclient_raises_with_the_servers_message(client):
    with pytest.raises(InferenceServerException) as raised:
        client.infer("mlp", [x_input(floats(1, 5))])
    assert raised.value.status() == "400" and "model takes [-1, 4]" in raised.value.message()
    with pytest.raises(InferenceServerException) as raised:
        client.infer("mlp", [x_input(floats(1, 4), name="z")])
    assert "unknown input 'z'" in raised.value.message()
    with pytest.raises(InferenceServerException) as raised:
        client.infer("absent", [x_input(floats(1, 4))])
    assert raised.value.status() == "404"


def test_the_authorize_hook_refuses_before_anything_else(client, http):
    with pytest.raises(InferenceServerException) as raised:
        client.infer("secret", [x_input(floats(1, 4))])
    assert raised.value.status() == "403" and "not yours" in raised.value.message()
    assert http.get("/v2/models/secret").status_code == 403
    allowed = client.infer("secret", [x_input(floats(1, 4))], headers={"Authorization": "Bearer open-sesame"})
    assert allowed.as_numpy("y").shape == (1, 3)


# --- versions and the model repository extension --------------------------------------------------------


def test_a_broken_version_fails_with_its_reason_while_the_old_one_serves(client, server, http, tmp_path):
    registry = server.registry
    good = tmp_path / "v1.onnx"
    good.write_bytes(MLP_V1.bytes)
    broken = tmp_path / "v2.onnx"
    broken.write_bytes(BROKEN)
    assert server.call(registry.load("rollout", 1, ModelSource(good))).ready
    failed = server.call(registry.load("rollout", 2, ModelSource(broken)))
    assert failed.state is VersionState.FAILED and "cannot load" in failed.reason
    x = floats(2, 4)
    result = client.infer("rollout", [x_input(x)])
    assert result.get_response()["model_version"] == "1"
    np.testing.assert_allclose(result.as_numpy("y"), MLP_V1(x), rtol=1e-5, atol=1e-5)
    response = http.post("/v2/models/rollout/versions/2/infer", json=mlp_body())
    assert response.status_code == 503 and "FAILED" in response.json()["error"]
    assert not client.is_model_ready("rollout", "2")
    index = {(e["name"], e["version"]): e for e in client.get_model_repository_index()}
    assert index[("rollout", "1")]["state"] == "READY"
    assert index[("rollout", "2")]["state"] == "FAILED" and "cannot load" in index[("rollout", "2")]["reason"]

    sums = tmp_path / "v3.onnx"
    sums.write_bytes(MLP_V2.bytes)
    mismatch = server.call(registry.load("rollout", 3, ModelSource(sums, sha256="ab" * 32)))
    assert "sha256 mismatch" in mismatch.reason
    assert client.infer("rollout", [x_input(x)]).get_response()["model_version"] == "1"
    fixed = server.call(registry.load("rollout", 3, ModelSource(sums)))
    assert fixed.ready
    np.testing.assert_allclose(
        client.infer("rollout", [x_input(x)]).as_numpy("y"), MLP_V2(x), rtol=1e-5, atol=1e-5
    )


def test_unload_and_load_through_the_repository_extension(client, server, http, tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(MLP_V1.bytes)
    server.call(server.registry.load("repo", 1, ModelSource(path)))
    x = floats(1, 4)
    assert client.is_model_ready("repo")
    client.unload_model("repo")
    assert not client.is_model_ready("repo")
    response = http.post("/v2/models/repo/infer", json=mlp_body())
    assert response.status_code == 503 and "no ready version" in response.json()["error"]
    states = {e["name"]: e["state"] for e in client.get_model_repository_index()}
    assert states["repo"] == "UNAVAILABLE"
    assert all(e["state"] == "READY" for e in http.post("/v2/repository/index", json={"ready": True}).json())
    client.load_model("repo")
    np.testing.assert_allclose(
        client.infer("repo", [x_input(x)]).as_numpy("y"), MLP_V1(x), rtol=1e-5, atol=1e-5
    )
    with pytest.raises(InferenceServerException) as raised:
        client.load_model("never-heard-of")
    assert raised.value.status() == "404"

    path.write_bytes(BROKEN)  # a reload that fails says why
    response = http.post("/v2/repository/models/repo/unload")
    assert response.status_code == 200
    response = http.post("/v2/repository/models/repo/load")
    assert response.status_code == 400 and "cannot load" in response.json()["error"]


def test_requests_are_counted_per_model_version(client, server):
    stats = server.app.state.stats
    before = stats.of("two", "1").count
    a = triton.InferInput("a", [1, 3], "INT64")
    a.set_data_from_numpy(np.zeros((1, 3), np.int64))
    mask = triton.InferInput("mask", [1, 3], "BOOL")
    mask.set_data_from_numpy(np.ones((1, 3), bool))
    client.infer("two", [a, mask])
    with pytest.raises(InferenceServerException):
        client.infer("two", [a])
    counted = stats.of("two", "1")
    assert counted.count == before + 2 and counted.failure >= 1
    assert sum(counted.buckets) == counted.count and counted.latency_sum > 0
