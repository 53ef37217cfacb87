"""Into a running job through `gpuyard up` (docs/access.md): `exec` runs in the replica's environment, directory
and user and returns its exit code, `shell` runs through a pty, `port-forward` reaches an HTTP server in the job,
and another tenant, an unlisted port, a missing replica and a job that has ended are refused, on HTTP and on
every WebSocket upgrade. As root (as CI runs), jobs run as their tenant's user, and so does what `exec` runs."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import tempfile
import uuid
from pathlib import Path

import httpx
import pytest
import websockets

from gpuyard.access import AccessError, ExecSession, exec_command
from gpuyard.client import Client
from gpuyard.shared.contracts.api.access import ExecStart

from .conftest import BIN, Platform, free_port, wait_for

pytestmark = pytest.mark.integration
SYSTEM_PYTHON = "/usr/bin/python3"


@pytest.fixture(scope="module")
def access_platform(tmp_path_factory):
    """A platform whose jobs run as their tenant's user when it runs as root (outside /tmp: see test_tenants)."""
    base = tmp_path_factory.mktemp("access")
    job_root = Path(
        tempfile.mkdtemp(prefix="gpuyard-test-access-", dir="/var/lib" if os.geteuid() == 0 else None)
    )
    job_root.chmod(0o711)
    env = {"GPUYARD_JOB_USERS": "", "GPUYARD_JOB_ROOT": str(job_root / "jobs")} if os.geteuid() == 0 else {}
    p = Platform(base / "data", base / "config", env=env, executors=2).start()  # (the gateway: worker 0's)
    yield p
    p.stop()
    shutil.rmtree(job_root, ignore_errors=True)


@pytest.fixture(scope="module")
def tenants(access_platform):
    admin = access_platform.client()
    return {
        name: Client(access_platform.server, admin.create_token(tenant=name, user="ana").token, timeout=30)
        for name in ("vision", "nlp")
    }


def running(platform: Platform, client: Client, spec: dict) -> str:
    job_id = client.submit({"tenant": "vision", "resources": {"gpus": 1}, **spec}).job_id
    platform.wait_state(job_id, {"running"})
    return job_id


def run_exec(platform: Platform, client: Client, job_id: str, argv: list[str], **kw) -> tuple[int, str, str]:
    out: dict[int, bytes] = {1: b"", 2: b""}

    def collect(stream: int, data: bytes) -> None:
        out[stream] += data

    code = asyncio.run(exec_command(platform.server, client.token, job_id, argv, on_output=collect, **kw))
    return code, out[1].decode(), out[2].decode()


def upgrade_status(platform: Platform, token: str, path: str) -> tuple[int, bytes]:
    """The status (and body) of a refused WebSocket upgrade at `path`; 101 when it opened."""

    async def attempt() -> tuple[int, bytes]:
        url = "ws" + platform.server.removeprefix("http") + path
        try:
            async with websockets.connect(
                url, additional_headers={"Authorization": f"Bearer {token}"}, proxy=None
            ):
                return 101, b""
        except websockets.exceptions.InvalidStatus as exc:
            return exc.response.status_code, exc.response.body or b""

    return asyncio.run(attempt())


def test_exec_runs_in_the_replicas_environment_directory_and_user(access_platform, tenants):
    vision = tenants["vision"]
    job_id = running(
        access_platform,
        vision,
        {
            "command": 'echo mine > /tmp/access-$GPUYARD_JOB_ID; echo "job: $CUDA_VISIBLE_DEVICES $(id -u) $(pwd)"; '
            "exec sleep 300"
        },
    )
    job_line = wait_for(
        lambda: next((line for line in vision.logs(job_id).splitlines() if line.startswith("job: ")), None),
        20,
        what="the job's own line",
    )
    code, out, err = run_exec(
        access_platform,
        vision,
        job_id,
        ["sh", "-c", 'echo "job: $CUDA_VISIBLE_DEVICES $(id -u) $(pwd)"; echo oops >&2; exit 7'],
    )
    assert (code, out.strip(), err.strip()) == (7, job_line, "oops")
    code, out, _ = run_exec(access_platform, vision, job_id, ["sh", "-c", "cat /tmp/access-$GPUYARD_JOB_ID"])
    assert (code, out) == (0, "mine\n")  # (its /tmp, a private one where the node gives jobs their own)
    started = next(e.event["data"] for e in vision.events(job_id) if e.event["type"].endswith(".job.started"))
    if started["isolation"].startswith("private /tmp"):
        assert not Path(f"/tmp/access-{job_id}").exists()  # exec entered the job's mount namespace
    gpus, uid, _ = job_line.removeprefix("job: ").split(" ", 2)
    assert gpus != ""
    if os.geteuid() == 0:
        assert uid != "0", "a root platform runs its tenants' jobs, and what exec runs, as their own users"
    cli = subprocess.run(
        [str(BIN / "gpuyard"), "exec", job_id, "--", "sh", "-c", "echo from-cli; exit 5"],
        env={**access_platform.env, "GPUYARD_SERVER": access_platform.server, "GPUYARD_TOKEN": vision.token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (cli.returncode, cli.stdout, cli.stderr) == (5, "from-cli\n", "")
    missing = subprocess.run(
        [str(BIN / "gpuyard"), "exec", job_id, "--replica", "3", "--", "true"],
        env={**access_platform.env, "GPUYARD_SERVER": access_platform.server, "GPUYARD_TOKEN": vision.token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        missing.returncode == 1 and "has no replica 3" in missing.stderr and "Traceback" not in missing.stderr
    )
    vision.cancel(job_id)


def test_shell_runs_an_interactive_command_through_a_pty(access_platform, tenants):
    vision = tenants["vision"]
    job_id = running(access_platform, vision, {"command": "sleep 300"})

    async def shell() -> tuple[int | None, bytes]:
        start = ExecStart(argv=["sh"], size=(100, 30), stdin=True, term="xterm-256color")
        session = await ExecSession.open(access_platform.server, vision.token, job_id, start, tty=True)
        # (the inner sh prints once the shell has made it the terminal's foreground: Ctrl-C then reaches it and
        # its sleep, never the shell alone, which would let the sleep run its 100 s)
        await session.send_input(b"sh -c 'echo sleeping-$((1+1)); exec sleep 100'; echo woke-$((1+2))\n")
        seen, interrupted = b"", False
        async for _, data in session.output():
            seen += data
            if b"sleeping-2" in seen and not interrupted:
                interrupted = True
                await session.send_input(b"\x03")
                await session.send_input(b"tty; echo TERM=$TERM; stty size; exit 3\n")
        return session.exit_code, seen

    code, seen = asyncio.run(shell())
    assert code == 3, seen
    assert b"/dev/pts/" in seen and b"TERM=xterm-256color" in seen and b"30 100" in seen, seen
    assert b"woke-3" not in seen, seen  # (the sleep's line was interrupted as a whole)
    vision.cancel(job_id)


def test_port_forward_reaches_an_http_server_in_the_job(access_platform, tenants):
    vision = tenants["vision"]
    port = free_port()
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    job_id = running(
        access_platform,
        vision,
        {
            "command": f"echo {marker} > {marker}.txt; exec {SYSTEM_PYTHON} -m http.server {port} --bind 127.0.0.1",
            "ports": [port],
        },
    )
    url = f"{access_platform.server}/jobs/{job_id}/ports/{port}/{marker}.txt"
    headers = {"Authorization": f"Bearer {vision.token}"}
    answer = wait_for(
        lambda: (r := httpx.get(url, headers=headers, timeout=10)).status_code == 200 and r,
        30,
        what="the job's HTTP server through the proxy",
    )
    assert answer.text == f"{marker}\n"
    unlisted = httpx.get(
        f"{access_platform.server}/jobs/{job_id}/ports/{port + 1}/", headers=headers, timeout=10
    )
    assert unlisted.status_code == 404 and "does not list port" in unlisted.json()["detail"]
    local = free_port()
    forward = subprocess.Popen(
        [str(BIN / "gpuyard"), "port-forward", job_id, str(port), "--local", str(local)],
        env={**access_platform.env, "GPUYARD_SERVER": access_platform.server, "GPUYARD_TOKEN": vision.token},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert forward.stdout is not None
        assert forward.stdout.readline().startswith(f"Forwarding http://127.0.0.1:{local}/")
        listing = httpx.get(f"http://127.0.0.1:{local}/", timeout=10)
        assert listing.status_code == 200 and f"{marker}.txt" in listing.text
        assert httpx.get(f"http://127.0.0.1:{local}/{marker}.txt", timeout=10).text == f"{marker}\n"
    finally:
        forward.terminate()
        forward.wait(10)
    vision.cancel(job_id)


def test_another_tenant_is_refused_on_every_route_and_upgrade(access_platform, tenants):
    vision, nlp = tenants["vision"], tenants["nlp"]
    port = free_port()
    job_id = running(access_platform, vision, {"command": "sleep 300", "ports": [port]})
    refused = httpx.get(
        f"{access_platform.server}/jobs/{job_id}/ports/{port}/",
        headers={"Authorization": f"Bearer {nlp.token}"},
        timeout=10,
    )
    assert refused.status_code == 404 and job_id not in refused.text.replace(f"'{job_id}'", "")
    assert upgrade_status(access_platform, nlp.token, f"/v1/jobs/{job_id}/exec")[0] == 404
    assert upgrade_status(access_platform, nlp.token, f"/jobs/{job_id}/ports/{port}/ws")[0] == 404
    assert upgrade_status(access_platform, "not-a-token", f"/v1/jobs/{job_id}/exec")[0] == 401
    nobody = httpx.get(f"{access_platform.server}/jobs/{job_id}/ports/{port}/", timeout=10)
    assert nobody.status_code == 401
    with pytest.raises(AccessError, match="no job"):
        run_exec(access_platform, nlp, job_id, ["true"])
    vision.cancel(job_id)


def test_an_exec_ends_with_its_job_and_a_job_that_ended_is_refused(access_platform, tenants):
    vision = tenants["vision"]
    job_id = running(access_platform, vision, {"command": "sleep 300"})

    async def outlive() -> str:
        session = await ExecSession.open(
            access_platform.server,
            vision.token,
            job_id,
            ExecStart(argv=["sh", "-c", "echo in; exec sleep 300"]),
        )
        try:
            async for _, data in session.output():
                if b"in" in data:
                    await asyncio.to_thread(vision.cancel, job_id)
        except AccessError as exc:
            return str(exc)
        finally:
            await session.close()
        return f"ended with {session.exit_code}"

    said = asyncio.run(outlive())
    assert "has ended" in said or "ended with" in said, said
    access_platform.wait_state(job_id, {"cancelled"})
    status, body = upgrade_status(access_platform, vision.token, f"/v1/jobs/{job_id}/exec")
    assert status == 409 and b"only a running job" in body
    with pytest.raises(AccessError, match="cancelled: only a running job"):
        run_exec(access_platform, vision, job_id, ["true"])


def test_the_cli_shell_gives_a_raw_terminal_and_puts_it_back(access_platform, tenants):
    """`gpuyard shell JOB` on a terminal of its own (a pty here): what is typed reaches the job's shell, the
    shell's exit code is the command's, and the local terminal is in its own mode again after."""
    import pty
    import select
    import termios

    vision = tenants["vision"]
    job_id = running(access_platform, vision, {"command": "sleep 300"})
    master, slave = pty.openpty()
    before = termios.tcgetattr(slave)
    shell = subprocess.Popen(
        [str(BIN / "gpuyard"), "shell", job_id],
        env={**access_platform.env, "GPUYARD_SERVER": access_platform.server, "GPUYARD_TOKEN": vision.token},
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    seen = b""

    def read_until(marker: bytes) -> bool:
        nonlocal seen
        while marker not in seen:
            ready, _, _ = select.select([master], [], [], 30)
            if not ready:
                return False
            seen += os.read(master, 4096)
        return True

    try:
        assert select.select([master], [], [], 30)[0], (
            "no prompt"
        )  # (the shell is there: it wrote its prompt)
        os.write(master, b"echo typed-$((2+3))\r")
        assert read_until(b"typed-5"), seen
        os.write(master, b"exit 4\r")
        assert shell.wait(30) == 4, seen
        assert termios.tcgetattr(slave) == before  # (the local terminal put back as it was)
    finally:
        if shell.poll() is None:
            shell.kill()
        os.close(master)
        os.close(slave)
    vision.cancel(job_id)
