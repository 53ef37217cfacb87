"""No request stalls the API (the real platform, `gpuyard up`): a model upload without a token is answered 401
before its body has been sent; while one tenant uploads the largest model the platform takes, another
tenant's `GET /v1/jobs` is answered; and so it is while, at the same time, a third tenant's oversized inference
is being read by the serving port, which then answers it 413 as the limit is passed. (How fast, under a model's
upload and check, and with oversized inferences beside it: benchmarks/api_under_upload.py.)"""

from __future__ import annotations

import json
import socket

import httpx
import numpy as np
import pytest

from benchmarks.api_under_upload import frame, read_answer  # (the benchmark's raw HTTP, shared)
from gpuyard.client import Client
from tests.integration.conftest import Platform, wait_for
from tests.unit.services.serving.models import Mlp
from tests.unit.services.submit.test_upload_models import sized_model

pytestmark = pytest.mark.integration

MAX_MODEL = "24MiB"
MODEL_MEGABYTES = 23  # (and a few hundred bytes of graph: the largest the platform takes)
MAX_REQUEST = 1 << 20  # the serving port's largest request body (max_request_bytes), low for the test
WIDE = Mlp(inputs=256, seed=3)  # x [N, 256]: at 1024 rows its inputs allow more than MAX_REQUEST, which binds


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("stall")
    p = Platform(
        base / "data",
        base / "config",
        simulate_gpus=1,
        executors=1,
        env={"GPUYARD_MAX_MODEL_BYTES": MAX_MODEL, "GPUYARD_MAX_REQUEST_BYTES": str(MAX_REQUEST)},
    )
    p.start()
    yield p
    if p.proc.poll() is None:
        p.stop()


@pytest.fixture(scope="module")
def tokens(platform) -> dict[str, str]:
    """A token of tenant vision, one of tenant nlp and one of tenant speech."""
    admin = platform.client()
    return {
        tenant: admin.request("POST", "/v1/admin/tokens", json={"tenant": tenant, "user": "t"})["token"]
        for tenant in ("vision", "nlp", "speech")
    }


def start_upload(
    platform: Platform, head: bytes, headers: dict[str, str], name: str = "big"
) -> socket.socket:
    """A `POST /v1/models` (model `name`) whose request line, `headers` and the first bytes of the body (`head`)
    are sent; the rest is the caller's to send (or not)."""
    sock = socket.create_connection(("127.0.0.1", platform.port), timeout=60)  # (a bound: a failed test ends)
    lines = [
        f"POST /v1/models?name={name} HTTP/1.1",
        f"Host: 127.0.0.1:{platform.port}",
        "Content-Type: application/octet-stream",
        *(f"{key}: {value}" for key, value in headers.items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + head)
    return sock


@pytest.mark.parametrize(
    "framing",
    [{"Content-Length": str(500 << 20)}, {"Transfer-Encoding": "chunked"}],
    ids=["content-length", "chunked"],
)
def test_an_upload_without_a_token_is_answered_before_its_body_is_sent(platform, framing):
    head = b"\0" * 4096 if "Content-Length" in framing else b"1000\r\n" + b"\0" * 4096 + b"\r\n"
    sock = start_upload(platform, head, framing)  # 4 KB of 500 MiB (or of a chunked body with no end)
    try:
        status, body = read_answer(sock)  # arrives though the client has sent next to nothing
    finally:
        sock.close()
    assert status == 401 and b"missing bearer token" in body


def test_another_tenant_is_answered_while_one_uploads_the_largest_model(platform, tokens):
    data = sized_model(MODEL_MEGABYTES)
    half = len(data) // 2
    headers = {"Authorization": f"Bearer {tokens['vision']}", "Content-Length": str(len(data))}
    upload = start_upload(platform, data[:half], headers)
    try:
        # the upload is under way, half of its body still to come: nlp's listing is answered meanwhile
        jobs = httpx.get(
            f"{platform.server}/v1/jobs", headers={"Authorization": f"Bearer {tokens['nlp']}"}, timeout=60
        )
        assert jobs.status_code == 200 and jobs.json()["items"] == []
        upload.sendall(data[half:])
        status, body = read_answer(upload)
    finally:
        upload.close()
    assert status == 201, body
    published = httpx.get(
        f"{platform.server}/v1/models/big",
        headers={"Authorization": f"Bearer {tokens['vision']}"},
        timeout=60,
    ).json()
    assert published["versions"][0]["size_bytes"] == len(data)
    assert not any(
        (platform.data_dir / "models" / ".uploads").iterdir()
    )  # the upload's file moved into place


# --- an upload and an oversized inference at the same time ---------------------------------------------------


def rows_body(n: int) -> bytes:
    """A v2 inference request of `n` rows for WIDE, in JSON, as a client writes it."""
    x = np.full((n, WIDE.inputs), 0.125, dtype=np.float32)
    return json.dumps(
        {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    ).encode()


@pytest.fixture(scope="module")
def served(platform, tokens) -> str:
    """Tenant speech's model `wide`, published and deployed (a quarter of the GPU), answering an inference on
    the serving port; speech's token."""
    token = tokens["speech"]
    published = Client(platform.server, token, timeout=60).publish_model(
        WIDE.bytes, "wide", serve={"gpus": 0.25, "cpus": 0.1, "memory": "256MB"}
    )
    [job] = published.deployment.job_ids
    platform.wait_state(job, {"running"}, 60)
    url = f"http://127.0.0.1:{platform.serving_port}/v2/models/wide/infer"
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def answers() -> bool:
        return httpx.post(url, content=rows_body(2), headers=auth, timeout=30).status_code == 200

    wait_for(answers, 30, 0.2, "wide answering on the serving port")
    return token


def start_inference(platform: Platform, token: str, head: bytes) -> socket.socket:
    """A chunked `POST /v2/models/wide/infer` on the serving port whose headers and first chunk (`head`) are
    sent; the rest is the caller's to send."""
    sock = socket.create_connection(("127.0.0.1", platform.serving_port), timeout=60)
    lines = [
        "POST /v2/models/wide/infer HTTP/1.1",
        f"Host: 127.0.0.1:{platform.serving_port}",
        "Content-Type: application/json",
        f"Authorization: Bearer {token}",
        "Transfer-Encoding: chunked",
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + frame(head))
    return sock


def unanswered(sock: socket.socket) -> bool:
    """Whether nothing has come back on `sock` yet (and it is still open): its request is still in flight."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    finally:
        sock.setblocking(True)
    return False


def test_another_tenant_is_answered_while_one_uploads_and_another_sends_an_oversized_inference(
    platform, tokens, served
):
    data = sized_model(MODEL_MEGABYTES)
    half = len(data) // 2
    headers = {"Authorization": f"Bearer {tokens['vision']}", "Content-Length": str(len(data))}
    oversized = rows_body(1024)  # the most rows a request may carry, but in JSON more than MAX_REQUEST bytes
    assert len(oversized) > MAX_REQUEST
    upload = start_upload(platform, data[:half], headers, name="beside-an-inference")
    inference = start_inference(platform, served, oversized[: MAX_REQUEST // 2])  # below the limit so far
    try:
        # both under way, the rest of each body still to come: nlp's listing is answered meanwhile
        jobs = httpx.get(
            f"{platform.server}/v1/jobs", headers={"Authorization": f"Bearer {tokens['nlp']}"}, timeout=60
        )
        assert jobs.status_code == 200 and jobs.json()["items"] == []
        assert unanswered(upload) and unanswered(inference)  # (still in flight when the listing came back)
        upload.sendall(data[half:])
        status, body = read_answer(upload)
        assert status == 201, body
        sent = MAX_REQUEST // 2
        while sent <= MAX_REQUEST:  # past the limit, then nothing more: the server has all it needs to refuse
            inference.sendall(frame(oversized[sent : sent + 65536]))
            sent += 65536
        status, body = read_answer(inference)
    finally:
        upload.close()
        inference.close()
    # a chunked body is refused only by reading it: the serving port was reading this one all along
    assert status == 413 and set(json.loads(body)) == {"error"}, body
    said = json.loads(body)["error"]  # (the server's limit binds, not the model's: it says so)
    assert f"the request body is over {MAX_REQUEST} bytes, the most this server reads" in said, body
