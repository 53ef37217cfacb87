"""Dev environments through `gpuyard up` (docs/dev.md): `gpuyard dev start` runs JupyterLab as a job, reached
through the platform's proxy with the tenant's token (its REST API, and a kernel over its WebSocket that prints
the replica's CUDA_VISIBLE_DEVICES and tenant), refused to another tenant (403, on HTTP and on the WebSocket
upgrade); a notebook written in one is there in the next (the user's own volume); and one left idle is stopped
by the monitor's idle reclaim, with its event and its line."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import threading
import uuid

import pytest
import websockets

from gpuyard.client import Client
from tests.integration.conftest import ROOT, Platform, sse_events, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def platform(tmp_path_factory):
    base = tmp_path_factory.mktemp("dev")
    env = {
        "GPUYARD_SAMPLE_INTERVAL": "0.5",
        "GPUYARD_JOBS_INTERVAL": "0.5",
        "GPUYARD_IDLE_MIN_AGE": "1",
        "GPUYARD_GRACE_SECONDS": "2",
        "GPUYARD_IDLE_GRACE": "2",
    }
    p = Platform(base / "data", base / "config", env=env).start()
    yield p
    if p.proc.poll() is None:
        p.stop()


@pytest.fixture(scope="module")
def tenants(platform):
    admin = platform.client()
    return {
        name: Client(platform.server, admin.create_token(tenant=name, user="ana").token, timeout=30)
        for name in ("vision", "nlp")
    }


def started(platform: Platform, client: Client, *args: str) -> str:
    """`gpuyard dev start` (it waits until JupyterLab answers through the proxy): the environment's id."""
    done = platform.cli(
        "dev", "start", "--server", platform.server, "--token", client.token, "--json", *args, timeout=180
    )
    assert done.returncode == 0, done.stderr + done.stdout
    dev = json.loads(done.stdout)
    assert dev["state"] == "running" and dev["url"] == f"/dev/{dev['job_id']}/lab"
    return dev["job_id"]


def ws_url(platform: Platform, path: str) -> str:
    return "ws" + platform.server.removeprefix("http") + path


def run_cell(platform: Platform, token: str, job_id: str, kernel: str, code: str) -> str:
    """`code` run in the kernel through its WebSocket (Jupyter's messaging protocol, JSON frames): its output."""

    async def run() -> str:
        session, msg_id = uuid.uuid4().hex, uuid.uuid4().hex
        request = {
            "header": {"msg_id": msg_id, "username": "ana", "session": session, "msg_type": "execute_request",
                       "version": "5.3", "date": "2026-01-01T00:00:00Z"},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True},
        }  # fmt: skip
        url = ws_url(platform, f"/dev/{job_id}/api/kernels/{kernel}/channels?session_id={session}")
        out = ""
        async with websockets.connect(
            url, additional_headers={"Authorization": f"Bearer {token}"}, proxy=None
        ) as ws:
            await ws.send(json.dumps(request))
            while True:
                msg = json.loads(await asyncio.wait_for(ws.recv(), 60))
                if msg.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if msg["msg_type"] == "stream":
                    out += msg["content"]["text"]
                elif msg["msg_type"] == "error":
                    raise AssertionError(msg["content"])
                elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                    return out

    return asyncio.run(run())


def upgrade_status(platform: Platform, token: str, path: str) -> int:
    async def attempt() -> int:
        try:
            async with websockets.connect(
                ws_url(platform, path), additional_headers={"Authorization": f"Bearer {token}"}, proxy=None
            ):
                return 101
        except websockets.exceptions.InvalidStatus as exc:
            return exc.response.status_code

    return asyncio.run(attempt())


def test_a_dev_environment_through_the_proxy_then_idle_stopped_with_its_notebook_kept(platform, tenants):
    vision, nlp, admin = tenants["vision"], tenants["nlp"], platform.client()
    job_id = started(platform, vision, "--gpus", "0.5", "--name", "explore", "--idle-timeout", "off")
    base = f"/dev/{job_id}"
    status = vision.http.get(f"{base}/api/status")
    assert status.status_code == 200 and "last_activity" in status.json()

    kernel = vision.http.post(f"{base}/api/kernels", json={"name": "python3"})
    assert kernel.status_code == 201, kernel.text
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ['GPUYARD_TENANT'])"
    printed = run_cell(platform, vision.token, job_id, kernel.json()["id"], code)
    job = vision.job(job_id)
    assert printed.split() == [str(job.placements[0].gpus[0].index), "vision"]

    # another tenant: 403 on HTTP and on the WebSocket upgrade; no credentials: 401
    assert nlp.http.get(f"{base}/api/status").status_code == 403
    channels = f"{base}/api/kernels/{kernel.json()['id']}/channels"
    assert upgrade_status(platform, nlp.token, channels) == 403
    assert Client(platform.server, None).http.get(f"{base}/api/status").status_code == 401

    # a notebook, kept in the user's own volume for the next environment
    notebook = {
        "type": "notebook",
        "content": {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5},
    }
    assert vision.http.put(f"{base}/api/contents/kept.ipynb", json=notebook).status_code == 201
    listed = json.loads(
        platform.cli("dev", "ls", "--server", platform.server, "--token", vision.token, "--json").stdout
    )
    assert [d["job_id"] for d in listed["items"]] == [job_id] and listed["items"][0]["notebooks"] == "dev-ana"
    assert (
        platform.cli("dev", "stop", job_id, "--server", platform.server, "--token", vision.token).returncode
        == 0
    )
    platform.wait_state(job_id, {"cancelled"})

    seen: list[dict] = []
    connected = threading.Event()

    def listen():
        seen.extend(sse_events(platform.server, admin.token, {"subject": "idle.>"}, 2, 90, connected))

    threading.Thread(target=listen, daemon=True).start()
    assert connected.wait(20), "the event stream did not connect"
    again = started(platform, vision, "--gpus", "0.5", "--idle-timeout", "3s")
    contents = vision.http.get(f"/dev/{again}/api/contents")
    assert "kept.ipynb" in [item["name"] for item in contents.json()["content"]]

    try:
        ended = platform.wait_state(again, {"failed", "succeeded", "cancelled"}, timeout=60)
    except AssertionError:
        gpus = admin.request("GET", "/v1/nodes")
        raise AssertionError(f"not stopped: {gpus}\n{vision.logs(again)[-3000:]}") from None
    assert ended.state == "failed" and ended.failure is not None and ended.failure.reason == "idle", ended
    wait_for(lambda: len(seen) >= 2, 20, 0.1, "the idle warning and stop events")
    assert [(e["type"], e["data"]["job_id"]) for e in seen] == [
        ("io.gpuyard.idle.warning", again),
        ("io.gpuyard.idle.stop", again),
    ], seen
    assert "[gpuyard] idle: stopped for idle GPUs" in vision.logs(again)


def test_the_readmes_dev_environment_lines_run_as_typed(platform, tenants):
    """The README's dev environment block, each line as typed (DEV_ID: the one `dev start` started), with the
    tenant's token and this platform's address in the environment, and no display (`dev open` prints)."""
    readme = (ROOT / "README.md").read_text()
    [block] = [b for b in re.findall(r"```bash\n(.*?)```", readme, re.S) if "gpuyard dev start" in b]
    env = {**platform.env, "GPUYARD_SERVER": platform.server, "GPUYARD_TOKEN": tenants["vision"].token}
    env.pop("DISPLAY", None)
    dev_id = None
    for line in [ln.split("  #")[0].strip() for ln in block.splitlines() if ln.strip()]:
        done = subprocess.run(
            line.replace("DEV_ID", dev_id or "DEV_ID"), shell=True, cwd=ROOT, env=env, capture_output=True,
            text=True, timeout=180,
        )  # fmt: skip
        said = done.stdout + done.stderr
        assert done.returncode == 0, f"{line}\n{said}"
        if " start " in line:
            dev_id = re.search(r"dev environment (\w+) ", said).group(1)
            assert f"{platform.server}/dev/{dev_id}/lab" in said
        elif " ls" in line or " open " in line:
            assert f"/dev/{dev_id}/lab" in said
        elif " stop " in line:
            assert "cancel requested" in said
        else:
            pytest.fail(f"the test does not know what to expect of {line!r}")
    platform.wait_state(dev_id, {"cancelled"})


def keep_typing(platform: Platform, token: str, job_id: str, kernel: str, stop: threading.Event) -> None:
    """A user at work: a message on the kernel's WebSocket (a `kernel_info_request`) every 0.3 s, until `stop`."""

    async def run() -> None:
        session = uuid.uuid4().hex
        url = ws_url(platform, f"/dev/{job_id}/api/kernels/{kernel}/channels?session_id={session}")
        async with websockets.connect(
            url, additional_headers={"Authorization": f"Bearer {token}"}, proxy=None
        ) as ws:
            while not stop.is_set():
                header = {
                    "msg_id": uuid.uuid4().hex,
                    "username": "ana",
                    "session": session,
                    "msg_type": "kernel_info_request",
                    "version": "5.3",
                    "date": "2026-01-01T00:00:00Z",
                }
                request = {"header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
                           "buffers": [], "content": {}}  # fmt: skip
                await ws.send(json.dumps(request))
                try:
                    while True:  # (its answers read, not looked at)
                        await asyncio.wait_for(ws.recv(), 0.3)
                except TimeoutError:
                    pass

    asyncio.run(run())


def test_a_users_kernel_messages_keep_an_idle_environment_until_they_stop(platform, tenants):
    """Its GPU idle, an environment with a 4 s idle timeout runs on while its user sends messages on a kernel's
    WebSocket (the `dev.activity` events say so, over more than its timeout and grace); once they stop, it is
    stopped for idleness."""
    vision, admin = tenants["vision"], platform.client()
    job_id = started(platform, vision, "--gpus", "0.5", "--idle-timeout", "4s")
    kernel = vision.http.post(f"/dev/{job_id}/api/kernels", json={"name": "python3"})  # (activity itself)
    assert kernel.status_code == 201, kernel.text
    stop = threading.Event()
    typing = threading.Thread(
        target=keep_typing, args=(platform, vision.token, job_id, kernel.json()["id"], stop), daemon=True
    )
    typing.start()
    said: list[dict] = []

    def listen() -> None:
        said.extend(sse_events(platform.server, admin.token, {"subject": "dev.activity"}, 10, 60))

    threading.Thread(target=listen, daemon=True).start()
    try:
        # ten of them (about 10 s: more than its start-up allowance, timeout and grace), or it ended meanwhile
        wait_for(lambda: said or vision.job(job_id).state != "running", 60, 0.2, "ten dev.activity events")
        assert said and {e["data"]["job_id"] for e in said} == {job_id}, said
        assert vision.job(job_id).state == "running", vision.logs(job_id)[-2000:]
    finally:
        stop.set()
        typing.join(10)
    ended = platform.wait_state(job_id, {"failed", "succeeded", "cancelled"}, timeout=60)
    assert ended.state == "failed" and ended.failure is not None and ended.failure.reason == "idle", ended
