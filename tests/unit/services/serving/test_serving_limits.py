"""Request limits of the v2 app behind a real uvicorn server (`v2app.py`, `protocol.body_limit`): a body whose
`Content-Length` is over the limit is refused (413, the protocol's `{"error": ...}`) before it is sent, a chunked
one as soon as more than the limit has arrived; a model's inputs give it a tighter limit than the server's; a
normal inference still works; and while one client is still sending an oversized inference, another client's
inference is answered."""

from __future__ import annotations

import json
import socket

import httpx
import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from gpuyard.services.serving.access import Access
from gpuyard.services.serving.entry import create_entry_app
from gpuyard.services.serving.protocol import HEADER_ALLOWANCE, TensorSpec, body_limit
from gpuyard.services.serving.proxy import Forwarder
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.routing import Routes
from gpuyard.services.serving.runtime import load_onnx
from gpuyard.services.serving.v2app import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_REQUEST_ROWS, create_app
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.contracts.events.models import ExecutionProvider, ModelReady
from gpuyard.shared.contracts.events.models import TensorSpec as PublishedSpec
from gpuyard.shared.settings.serving import ServingSettings

from .models import Mlp, text_echo
from .server import serve

CAP = 256 * 1024
ROWS = 64
SMALL, WIDE = Mlp(inputs=4, seed=1), Mlp(inputs=256, seed=2)
SMALL_LIMIT = body_limit([TensorSpec("x", "FP32", (-1, 4))], ROWS, CAP)
CHUNK = 16 * 1024


@pytest.fixture(scope="module")
def server():
    registry = ModelRegistry()
    registry.add("small", 1, load_onnx(SMALL.bytes))
    registry.add("wide", 1, load_onnx(WIDE.bytes))
    registry.add("text", 1, load_onnx(text_echo()))
    with serve(create_app(registry, max_request_bytes=CAP, max_request_rows=ROWS)) as running:
        running.registry = registry
        yield running
        running.call(registry.close())


def connect(server) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=30)  # (a hung server fails, late)


def head(path: str, *lines: str) -> bytes:
    return "\r\n".join(
        [f"POST {path} HTTP/1.1", "Host: test", "Content-Type: application/json", *lines, "", ""]
    ).encode()


def answer_of(sock: socket.socket) -> tuple[int, dict[str, str], dict]:
    """The response on `sock`: status, headers, JSON body (read to the end the server gives it)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += recv(sock)
    top, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = top.decode().split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    while len(rest) < int(headers["content-length"]):
        rest += recv(sock)
    return int(status_line.split()[1]), headers, json.loads(rest)


def recv(sock: socket.socket) -> bytes:
    chunk = sock.recv(65536)
    if not chunk:
        raise AssertionError("the server closed the connection without an answer")
    return chunk


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def rows(n: int, width: int = 4) -> dict:
    x = np.ones((n, width), dtype=np.float32)
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [n, width], "data": x.ravel().tolist()}]}


# --- what a model's inputs allow ------------------------------------------------------------------------


def test_a_models_limit_follows_its_inputs_and_never_passes_the_servers():
    per_fp32 = (24 + 2 + 4) * 2  # the longest float, ", ", a bracket pair for each of 2 dims; JSON slack
    assert body_limit([TensorSpec("x", "FP32", (-1, 4))], 64, CAP) == HEADER_ALLOWANCE + 64 * 4 * per_fp32
    assert body_limit([TensorSpec("x", "FP32", (8, 4))], 64, CAP) == HEADER_ALLOWANCE + 8 * 4 * per_fp32
    assert body_limit([TensorSpec("x", "FP32", (-1, 4096))], 64, CAP) == CAP  # more than the server's
    assert body_limit([TensorSpec("x", "FP32", (-1, -1))], 64, CAP) == CAP  # not bounded past the first
    assert body_limit([TensorSpec("t", "BYTES", (-1, 1))], 64, CAP) == CAP  # a string of any length
    two = [TensorSpec("a", "INT64", (-1, 3)), TensorSpec("m", "BOOL", (-1, 3))]
    assert body_limit(two, 10, CAP) == HEADER_ALLOWANCE + 10 * 3 * ((20 + 6) * 2 + (5 + 6) * 2)
    # the signature read when the model was published (gpuyard.shared.modelfiles.signature) bounds it the same way
    published = [PublishedSpec(name="x", datatype="FP32", shape=[-1, 4])]
    assert body_limit(published, 64, CAP) == body_limit([TensorSpec("x", "FP32", (-1, 4))], 64, CAP)


def test_the_limits_are_settings_with_documented_defaults():
    fields = ServingSettings.model_fields
    assert DEFAULT_MAX_REQUEST_BYTES == fields["max_request_bytes"].default == 64 * 1024 * 1024
    assert DEFAULT_MAX_REQUEST_ROWS == fields["max_request_rows"].default == 1024
    assert "64 MiB" in fields["max_request_bytes"].description
    assert ServingSettings(max_request_bytes="1MiB").max_request_bytes == 1 << 20


# --- refused before the body is sent ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "length", "reason"),
    [
        ("/v2/models/small/infer", 1_500_000_000, f"over {CAP} bytes, the most this server reads"),
        (
            "/v2/models/small/infer",
            SMALL_LIMIT + 1,
            f"over {SMALL_LIMIT} bytes, the most a request to model 'small'",
        ),
        ("/v2/models/nothing/infer", 1_500_000_000, f"over {CAP} bytes"),  # (before the model is looked up)
        ("/v2/repository/index", CAP + 1, f"over {CAP} bytes"),
    ],
)
def test_an_oversized_content_length_is_413_before_the_body_is_sent(server, path, length, reason):
    with connect(server) as sock:
        sock.sendall(head(path, f"Content-Length: {length}"))  # and not one byte of the body
        status, headers, body = answer_of(sock)
    assert status == 413 and reason in body["error"], body
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"


def test_a_client_that_expects_100_continue_gets_413_instead(server):
    with connect(server) as sock:
        sock.sendall(head("/v2/models/small/infer", "Content-Length: 1500000000", "Expect: 100-continue"))
        status, _, body = answer_of(sock)
    assert status == 413 and "over" in body["error"]


# --- refused as soon as more than the limit has arrived -----------------------------------------------------


@pytest.mark.parametrize(("model", "limit"), [("small", SMALL_LIMIT), ("wide", CAP), ("text", CAP)])
def test_a_chunked_body_over_the_limit_is_413(server, model, limit):
    with connect(server) as sock:
        sock.sendall(head(f"/v2/models/{model}/infer", "Transfer-Encoding: chunked"))
        sent = 0
        while sent <= limit:  # then nothing more: the server has all it needs to refuse
            sock.sendall(chunk(b" " * CHUNK))
            sent += CHUNK
        status, headers, body = answer_of(sock)
    assert status == 413 and f"over {limit} bytes" in body["error"], body
    assert headers["connection"] == "close"


def test_more_rows_than_a_request_may_carry_is_413_with_the_reason(server, http):
    assert http.post("/v2/models/small/infer", json=rows(ROWS)).status_code == 200
    x = np.ones((ROWS + 1, 4), dtype=np.float32)
    binary = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [ROWS + 1, 4], "parameters": {"binary_data_size": x.nbytes}}]}  # fmt: skip
    header = json.dumps(binary).encode()
    refused = http.post(
        "/v2/models/small/infer",
        content=header + x.tobytes(),  # well under the body's limit, binary
        headers={"Inference-Header-Content-Length": str(len(header))},
    )
    assert refused.status_code == 413
    assert refused.json() == {
        "error": f"input 'x' has {ROWS + 1} rows: at most {ROWS} in one request; send fewer rows per request"
    }


# --- and everything else as before ---------------------------------------------------------------------------


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.base, timeout=30) as client:
        yield client


@pytest.mark.parametrize("binary", [True, False])
def test_a_normal_inference_still_works(server, binary):
    client = triton.InferenceServerClient(server.url)
    try:
        x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
        given = triton.InferInput("x", [2, 4], "FP32")
        given.set_data_from_numpy(x, binary_data=binary)
        answer = client.infer("small", [given])
        np.testing.assert_allclose(answer.as_numpy("y"), SMALL(x), rtol=1e-5)
        big = np.ones((ROWS + 1, 4), dtype=np.float32)
        given = triton.InferInput("x", list(big.shape), "FP32")
        given.set_data_from_numpy(big, binary_data=binary)
        with pytest.raises(InferenceServerException, match="at most 64 in one request") as refused:
            client.infer("small", [given])
        assert refused.value.status() == "413"
    finally:
        client.close()


def test_another_clients_inference_is_answered_while_an_oversized_one_is_in_flight(server, http):
    with connect(server) as sock:
        sock.sendall(head("/v2/models/wide/infer", "Transfer-Encoding: chunked"))
        sent = 0
        while sent < CAP // 2:  # half of it: the server holds it and waits for more
            sock.sendall(chunk(b" " * CHUNK))
            sent += CHUNK
        x = np.arange(8, dtype=np.float32).reshape(2, 4) / 8
        other = http.post(
            "/v2/models/small/infer",
            json={"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": x.ravel().tolist()}]},
        )
        assert other.status_code == 200, other.text
        np.testing.assert_allclose(
            np.array(other.json()["outputs"][0]["data"]).reshape(2, 3), SMALL(x), rtol=1e-5
        )
        sock.setblocking(False)
        with pytest.raises(BlockingIOError):  # the big one is still in flight: no answer to it yet
            sock.recv(1)
        sock.setblocking(True)
        while sent <= CAP:
            sock.sendall(chunk(b" " * CHUNK))
            sent += CHUNK
        status, _, body = answer_of(sock)
    assert status == 413 and f"over {CAP} bytes" in body["error"]


# --- on the serving entry point: a request forwarded to another node ------------------------------------------


async def test_an_oversized_body_for_another_node_is_413_there_and_never_forwarded():
    sent_on: list[httpx.Request] = []

    def node_b(request: httpx.Request) -> httpx.Response:
        sent_on.append(request)
        return httpx.Response(200, json={"model_name": "mnist"})

    class Catalog:
        async def get(self, tenant, name):
            return None

    registry, routes = ModelRegistry(), Routes("node-a")
    routes.ready(
        ModelReady(
            name="mnist",
            tenant="vision",
            version=1,
            job_id="j1",
            node="node-b",
            endpoint="http://node-b:8000",
            provider=ExecutionProvider.CPU,
        )  # fmt: skip
    )
    forwarder = Forwarder(registry, routes, httpx.AsyncClient(transport=httpx.MockTransport(node_b)))
    access = Access(Tokens(None, "tok=vision:ana"), Catalog(), registry, routes)
    app = create_entry_app(registry, access, forwarder, max_request_bytes=CAP)
    auth = {"Authorization": "Bearer tok"}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as client:
        ok = await client.post("/v2/models/mnist/infer", json=rows(2), headers=auth)
        assert ok.status_code == 200 and len(sent_on) == 1
        assert sent_on[0].url.path == "/v2/models/mnist/versions/1/infer"

        async def too_much():
            for _ in range(CAP // CHUNK + 1):
                yield b" " * CHUNK

        refused = await client.post("/v2/models/mnist/infer", content=too_much(), headers=auth)
        assert refused.status_code == 413 and f"over {CAP} bytes" in refused.json()["error"]
        assert len(sent_on) == 1
    await forwarder.close()
