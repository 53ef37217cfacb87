"""No request stalls the API (the real platform, `gpuyard up`): a model upload without a token is answered 401
before its body has been sent, and while one tenant uploads the largest model the platform takes, another
tenant's `GET /v1/jobs` is answered. (How fast, under a model's upload and check: benchmarks/api_under_upload.py.)"""

from __future__ import annotations

import socket

import httpx
import pytest

from tests.integration.conftest import Platform
from tests.unit.submit.test_upload_models import sized_model

pytestmark = pytest.mark.integration

MAX_MODEL = "24MiB"
MODEL_MEGABYTES = 23  # (and a few hundred bytes of graph: the largest the platform takes)


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("stall")
    p = Platform(
        base / "data",
        base / "config",
        simulate_gpus=1,
        executors=1,
        env={"GPUYARD_MAX_MODEL_BYTES": MAX_MODEL},
    )
    p.start()
    yield p
    if p.proc.poll() is None:
        p.stop()


@pytest.fixture(scope="module")
def tokens(platform) -> dict[str, str]:
    """A token of tenant vision and one of tenant nlp."""
    admin = platform.client()
    return {
        tenant: admin.request("POST", "/v1/admin/tokens", json={"tenant": tenant, "user": "t"})["token"]
        for tenant in ("vision", "nlp")
    }


def start_upload(platform: Platform, head: bytes, headers: dict[str, str]) -> socket.socket:
    """A `POST /v1/models` whose request line, `headers` and the first bytes of the body (`head`) are sent;
    the rest is the caller's to send (or not)."""
    sock = socket.create_connection(("127.0.0.1", platform.port), timeout=60)  # (a bound: a failed test ends)
    lines = [
        "POST /v1/models?name=big HTTP/1.1",
        f"Host: 127.0.0.1:{platform.port}",
        "Content-Type: application/octet-stream",
        *(f"{name}: {value}" for name, value in headers.items()),
    ]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + head)
    return sock


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """The status and the body of the answer on `sock` (one with a Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the connection closed with no answer: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed in the middle of the answer"
        body += chunk
    return status, body


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
