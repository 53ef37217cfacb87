"""/healthz and /readyz (`gpuyard.shared.runtime.health.HealthServer`), which every service serves and every probe (the
kubelet's, docker-compose's, `gpuyard up`'s) reads: a real server on a free port, real HTTP requests."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from gpuyard.shared.runtime.health import HealthServer


@pytest.fixture
async def server():
    state = {"ready": False}
    health = HealthServer("scheduler", lambda: state["ready"])
    port = await health.start()
    assert port > 0 and health.port == port  # port 0 asks for a free one; the one taken is reported
    yield health, state
    await health.stop()


async def get(health: HealthServer, path: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{health.port}", timeout=5) as client:
        return await client.get(path)


async def raw(health: HealthServer, request: bytes) -> bytes:
    """Send `request` as is and read the answer until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", health.port)
    writer.write(request)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_healthz_answers_ok_whether_or_not_the_service_is_ready(server):
    health, state = server
    for ready in (False, True):
        state["ready"] = ready
        response = await get(health, "/healthz")
        assert response.status_code == 200
        assert response.json() == {"status": "ok", "service": "scheduler"}
        assert response.headers["content-type"] == "application/json"


async def test_readyz_follows_the_readiness_function_on_every_request(server):
    health, state = server
    response = await get(health, "/readyz")
    assert (response.status_code, response.json()) == (503, {"ready": False, "service": "scheduler"})
    state["ready"] = True
    response = await get(health, "/readyz")
    assert (response.status_code, response.json()) == (200, {"ready": True, "service": "scheduler"})
    state["ready"] = False  # a service that is stopping answers not ready again
    assert (await get(health, "/readyz")).status_code == 503


async def test_other_paths_are_not_found(server):
    health, _ = server
    for path in ("/", "/health", "/readyz/x", "/metrics"):
        response = await get(health, path)
        assert (response.status_code, response.json()) == (404, {"detail": "not found"}), path


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"\r\n\r\n",  # no request line
        b"GARBAGE\r\n\r\n",  # a request line without a path
        b"\xff\xfe\xfd\r\n\r\n",  # not text
    ],
)
async def test_a_bad_request_gets_a_complete_not_found_answer_and_the_server_goes_on(server, request_bytes):
    health, state = server
    answer = await raw(health, request_bytes)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 404 Not Found\r\n")
    assert f"Content-Length: {len(body)}".encode() in head and json.loads(body) == {"detail": "not found"}
    state["ready"] = True
    assert (await get(health, "/readyz")).status_code == 200


async def test_a_client_that_hangs_up_at_once_does_not_stop_the_server(server):
    health, _ = server
    for _ in range(3):
        _, writer = await asyncio.open_connection("127.0.0.1", health.port)
        writer.close()
        await writer.wait_closed()
    assert (await get(health, "/healthz")).status_code == 200


async def test_a_stopped_server_refuses_connections():
    health = HealthServer("submit", lambda: True)
    port = await health.start()
    assert (await get(health, "/readyz")).status_code == 200
    await health.stop()
    with pytest.raises(OSError):
        await asyncio.open_connection("127.0.0.1", port)
