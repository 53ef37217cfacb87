"""benchmarks/serving.py's figures and rules that need no server: the CPU time of a process and of a process
group, the batching target's ceiling (no server carries more than the null endpoint) computed from a run's
figures, and how a peer with a readiness route (Triton) is waited for."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCHMARKS = Path(__file__).resolve().parents[4] / "benchmarks"
serving = pytest.importorskip("benchmarks.serving", reason="benchmarks/serving.py needs fastapi")


def test_the_cpu_time_of_a_process_counts_its_threads():
    before = serving.process_cpu_seconds(os.getpid())
    if before is None:
        pytest.skip("no /proc here")

    def spin() -> None:  # 0.3 s of CPU in a thread other than the main one
        spin_until = time.thread_time() + 0.3
        while time.thread_time() < spin_until:
            pass

    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    # /proc counts whole clock ticks, sampled: a margin of a few ticks (and of float rounding) either way
    assert serving.process_cpu_seconds(os.getpid()) - before >= 0.25
    assert serving.process_cpu_seconds(2**22 + 12345) is None  # no such process


SPIN_THEN_WAIT = """
import sys, time
spin_until = time.process_time() + 0.3
while time.process_time() < spin_until:
    pass
print("spun", flush=True)
sys.stdin.read()
"""


def test_the_cpu_time_of_a_process_group_counts_every_process_of_it():
    """A leader that starts a child in its group; the child spends 0.3 s of CPU, says so and waits: the group's
    time counts the child's, which the leader's own does not."""
    leader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys; subprocess.run([sys.executable, '-c', {SPIN_THEN_WAIT!r}])",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert leader.stdout.readline() == "spun\n"  # the child's, through the stdout it inherited
        group = serving.process_group_cpu_seconds(leader.pid)
        if group is None:
            pytest.skip("no /proc here")
        seconds, processes = group
        assert processes == 2
        assert seconds >= 0.25  # whole clock ticks, sampled: a margin either way
        assert serving.process_cpu_seconds(leader.pid) < 0.25  # the leader's own: only its start
        assert serving.process_group_cpu_seconds(2**22 + 12345) == (0, 0)  # no such group
    finally:
        os.killpg(leader.pid, signal.SIGTERM)
        leader.wait(10)


def test_triton_is_a_peer_waited_for_on_its_model_s_readiness_route():
    (server,) = serving.peer_servers(Path("/tmp/mlp.onnx"), "mlp", {"triton": "/venv/bin/python"})
    assert server.command[:2] == ["/venv/bin/python", str(BENCHMARKS / "serving_peers" / "triton_server.py")]
    assert server.bodies == ("json", "binary") and server.tritonclient
    assert server.ready_path == "/v2/models/mlp/ready"
    (kserve,) = serving.peer_servers(Path("/tmp/mlp.onnx"), "mlp", {"kserve": "/venv/bin/python"})
    assert kserve.ready_path is None  # its infer route itself


class FakeTriton:
    """An HTTP server on a free port answering, as Triton does while PyTriton loads the model, 400 on the model's
    readiness route its first `loading` times, then 200; every request it saw is kept (method and path)."""

    def __init__(self, loading: int):
        self.loading = loading
        self.seen: list[tuple[str, str]] = []

    async def answer(self, reader, writer) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):  # the client closing
            await self.answer_each(reader, writer)

    async def answer_each(self, reader, writer) -> None:
        while head := await reader.readuntil(b"\r\n\r\n"):
            method, path = head.split(b" ", 2)[:2]
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            self.seen.append((method.decode(), path.decode()))
            status = b"400 Bad Request" if len(self.seen) <= self.loading else b"200 OK"
            writer.write(b"HTTP/1.1 " + status + b"\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.answer, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_):
        self.server.close()


def waiting_for(port: int, ready_path: str | None):
    server = serving.Server("triton", [], port, ("json", "binary"), ready_path=ready_path)
    server.path = "/v2/models/mlp/infer"
    server.process = SimpleNamespace(poll=lambda: None)  # still running
    return server


def test_a_readiness_route_is_polled_until_it_answers_200_and_its_errors_are_waited_out():
    async def scenario():
        async with FakeTriton(loading=3) as triton:
            await serving.wait_until_answering(waiting_for(triton.port, "/v2/models/mlp/ready"), b"{}", 60)
            return triton.seen

    seen = asyncio.run(scenario())
    assert (
        seen == [("GET", "/v2/models/mlp/ready")] * 4
    )  # three 400s, then the 200; the infer route untouched


def test_without_a_readiness_route_an_error_on_the_infer_route_stops_the_wait():
    async def scenario():
        async with FakeTriton(loading=1) as triton:
            with pytest.raises(RuntimeError, match="answered HTTP 400"):
                await serving.wait_until_answering(waiting_for(triton.port, None), b"{}", 60)
            return triton.seen

    assert asyncio.run(scenario()) == [("POST", "/v2/models/mlp/infer")]


def figures(c1_p50: float, per_s: float | None = None, p95: float = 1.0, cpu: float | None = None) -> dict:
    out = {"c1": {"p50_ms": c1_p50}}
    if per_s is not None:
        out["c16"] = {"throughput_per_s": per_s, "p95_ms": p95}
        if cpu is not None:
            out["c16"]["server_cpu_us_per_request"] = cpu
    return out


def model(batched_per_s: float, batched_p95: float) -> dict:
    platform = {"platform_beyond_run": {"p50_ms": 0.1}}
    return {
        "servers": {
            "null": {
                "binary": figures(0.07, 30_000, cpu=30.0),
                "json": figures(0.08, 29_000, cpu=31.0),
                "tritonclient": figures(0.13),
            },
            "fastapi": {"json": figures(0.4, 3_000)},
            "gpuyard": {
                "binary": {**figures(0.2, 10_000, p95=2.0, cpu=90.0), **platform},
                "json": {**figures(0.37, 3_000, p95=6.0), **platform},
                "tritonclient": {**figures(0.28), **platform},
            },
            "gpuyard_batched": {
                "binary": figures(0.21, batched_per_s, p95=batched_p95, cpu=60.0),
                "json": figures(0.38, 3 * 3_000, p95=1.0),
            },
        }
    }


def test_the_batching_target_gives_the_ceiling_the_null_endpoint_sets():
    targets = serving.targets_of_model("mlp", model(15_000, 1.5), 16)
    binary, json = targets["dynamic_batching_3x_throughput_lower_p95_at_c16"]["checks"]
    assert binary["speedup"] == 1.5 and binary["holds"] is False
    assert binary["null_per_s"] == 30_000 and binary["ceiling_speedup"] == 3.0
    assert (binary["null_server_cpu_us_per_request"], binary["unbatched_server_cpu_us_per_request"]) == (
        30,
        90,
    )
    assert binary["batched_server_cpu_us_per_request"] == 60
    assert json["speedup"] == 3.0 and json["holds"] is True and json["ceiling_speedup"] == pytest.approx(9.67)
    assert "json_server_cpu_us_per_request" not in json
    assert targets["dynamic_batching_3x_throughput_lower_p95_at_c16"]["holds"] is False


def test_the_wide_model_reports_batching_too_marked_as_no_target_of_the_issue():
    targets = serving.targets_of_model("wide", model(30_000, 1.5), 16)
    batching = targets["dynamic_batching_3x_throughput_lower_p95_at_c16"]
    assert batching["holds"] is True and "mlp" in batching["note"]
