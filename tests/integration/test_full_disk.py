"""A full disk degrades, then recovers: the whole platform on a file system of 8 MiB of its own (a tmpfs the test
mounts; skipped where mount is not permitted), filled by a job that also prints as it goes.

While the disk is full: a submit is refused with 503, Retry-After and the reason (never 500), the node stays
alive (its executor answers /readyz), `gpuyard up` says once that it cannot write a service's log and keeps
reading its output. Once space is freed: NATS, whose JetStream failed a write, is restarted by `gpuyard up` and
its streams heal, every job accepted meanwhile runs, a new job succeeds, and SIGTERM stops everything."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from gpuyard.supervisor.diskroom import free_space
from tests.integration.conftest import Platform, wait_for
from tests.integration.processes import descendants

pytestmark = pytest.mark.integration

FULL = 64 << 10  # less free than this: the disk is full (a tmpfs keeps nothing back)


def mount_small(where: Path, size: str = "8m") -> Path:
    """A tmpfs of `size` at `where` (made), unmounted by `unmount`; the test is skipped where mount is not
    permitted (not root, no mount, a container without CAP_SYS_ADMIN)."""
    where.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no `mount` here to make a small file system")
    run = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if run.returncode != 0:
        pytest.skip(
            f"cannot mount a small file system here (`mount -t tmpfs`: {run.stderr.strip()}); as root it runs"
        )
    return where


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path):
    """An 8 MiB file system at tmp_path/data."""
    where = mount_small(tmp_path / "data")
    yield where
    unmount(where)


def health_port(up_pid: int, service: str) -> int:
    """The /readyz port `gpuyard up` gave the first process of `service` (from its command line)."""
    for pid in sorted(descendants(up_pid)):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:
            continue
        if f"gpuyard.services.{service}" in argv and "--health-port" in argv:
            return int(argv[argv.index("--health-port") + 1])
    raise AssertionError(f"no {service} process under {up_pid}")


def readyz(port: int) -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code
    except httpx.HTTPError:
        return None


def test_a_full_disk_degrades_then_recovers(small_disk, tmp_path):
    data = small_disk
    env = {
        "GPUYARD_STREAM_MAX_BYTES": "1MiB",  # 3 streams within 3/4 of 8 MiB (`gpuyard up` checks it)
        "GPUYARD_NODE_TIMEOUT": "600",  # the node's heartbeats are not stored while the disk is full
    }
    platform = Platform(data, tmp_path / "config", simulate_gpus=2, env=env, executors=1).start()
    up_log = platform.log
    said = lambda: up_log.read_text(errors="replace")  # noqa: E731
    try:
        client = platform.client()
        http = httpx.Client(
            base_url=platform.server, headers={"Authorization": f"Bearer {client.token}"}, timeout=90
        )
        filler, once = data / "filler", data / "filled-once"
        spam = "y" * 200
        fill = client.submit(
            {
                "name": "fill",
                "command": f"test -e {once} || {{ touch {once}; head -c 64M /dev/zero > {filler}; }}; echo filled; "
                f"while true; do echo {spam}; sleep 0.01; done",
                "resources": {"gpus": 1},
            }
        )
        wait_for(lambda: free_space(data)[0] < FULL, 120, 0.2, "the disk to fill")

        wait_for(
            lambda: re.search(r"GPUYARD_TELEMETRY.*critical write error", said()),
            120,
            0.2,
            "JetStream to fail a write of the telemetry stream",
        )

        accepted: list[str] = []
        logs = data / "logs"
        cannot = re.compile(rf"cannot write ({re.escape(str(logs))}/\S+\.log) \(no space left on its disk\)")

        def refused() -> httpx.Response | None:
            """A submit answered 503 once `gpuyard up` has said it cannot write a service's log (each refusal
            is a line in the submit service's)."""
            answer = http.post(
                "/v1/jobs", json={"name": "while-full", "command": "true", "resources": {"gpus": 2}}
            )
            if answer.status_code == 202:  # (the store's journal had room left): kept, to run later
                accepted.append(answer.json()["job_id"])
                return None
            assert answer.status_code == 503, answer.text
            return answer if cannot.search(said()) else None

        answer = wait_for(
            refused, 180, 0.2, "a submit refused for want of space, and a log `gpuyard up` cannot write"
        )
        assert int(answer.headers["Retry-After"]) > 0
        assert "disk is full" in answer.json()["detail"] or "no space left" in answer.json()["detail"]
        assert readyz(health_port(platform.proc.pid, "executor")) == 200  # the node is alive
        named = cannot.findall(said())
        assert len(named) == len(set(named)), named  # each said once while it lasts
        assert platform.proc.poll() is None

        filler.unlink()  # space again
        client.cancel(fill.job_id)
        wait_for(lambda: "restarting NATS to heal JetStream" in said(), 120, 0.2, "NATS restarted to heal")
        healed = time.monotonic()
        after = client.submit({"name": "after", "command": "echo after", "resources": {"gpus": 1}})
        platform.wait_state(after.job_id, {"succeeded"}, 180)
        assert client.logs(after.job_id).strip() == "after"
        for job_id in accepted:  # no accepted job lost
            platform.wait_state(job_id, {"succeeded"}, 180)
        assert client.job(fill.job_id).state == "cancelled"
        wait_for(  # a heartbeat stored in the telemetry stream since it healed, heard by the API
            lambda: any(
                n.node == "node-a"
                and n.state == "ready"
                and n.last_seen_seconds_ago < time.monotonic() - healed
                for n in client.nodes()
            ),
            60,
            0.5,
            "the node's heartbeats to be heard again",
        )

        platform.proc.send_signal(signal.SIGTERM)
        assert platform.proc.wait(120) == 0
        assert "Stopped; no process left behind." in said()
    finally:
        if platform.proc.poll() is None:
            platform.proc.kill()
            platform.proc.wait(30)
            platform.kill_leftovers()  # (its filling job, which a SIGKILL of `gpuyard up` leaves running)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(data / "filler")
