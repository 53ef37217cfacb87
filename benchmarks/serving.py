"""Serving benchmark: GPUYard's Open Inference Protocol v2 endpoint against its floors and peers,
on the same ONNX models and with one load generator for all.

    # in-tree servers only, quick (< 1 minute):
    python benchmarks/serving.py --requests 300 --seconds 1 --markdown
    # the full measurement, with peers in their own virtual environments:
    python benchmarks/serving.py --requests 3000 --seconds 10 --markdown \\
        --peer kserve=/tmp/peer-kserve/bin/python --peer litserve=/tmp/peer-litserve/bin/python \\
        --peer rayserve=/tmp/peer-ray/bin/python --peer triton=/tmp/peer-triton/bin/python

Models (built here with onnx.helper, FP32, batch dimension of any size): `mlp` 784-256-10 and `wide`
1024-4096-4096-1024. What is measured, per model:

- `session_run`: the bare in-process `session.run` on one row (the model's floor), and on a batch of 16;
- `null`: uvicorn + Starlette reading the body and answering a constant (GPUYard's own answer to the same
  request, encoded once at start): the floor of HTTP on this stack, with the binary and the JSON body;
- `fastapi`: a bare FastAPI v2-JSON endpoint around the session (json + numpy, `session.run` in a thread):
  the same JSON work with nothing else;
- `gpuyard` and `gpuyard_batched`: `create_app` under uvicorn, one worker, dynamic batching off and on;
- peers given with `--peer NAME=PYTHON` (kserve, litserve, rayserve, triton; their servers are in
  benchmarks/serving_peers/), each serving the same model through its own ONNX Runtime session, without
  dynamic batching (triton: Triton Inference Server calling a Python function through PyTriton).

Every server is its own process on a free port, warmed up, with ONNX Runtime at one intra-op thread. The load
generator writes its HTTP/1.1 requests by hand on keep-alive connections (as pipeline.py's `Submitter`), so its
own cost is small and the same for every server: p50 and p99 at concurrency 1, throughput and p95 at
concurrency `--concurrency` (16). tritonclient.http measures the binary path at concurrency 1 (GPUYard, the
null endpoint, and peers that speak the binary extension). Inside GPUYard's server, an ASGI wrapper times
each request from the app's call to its last body byte and a proxy session times each `session.run`: the
difference at concurrency 1 is the time spent in the platform beyond the model, given as a histogram. At
concurrency 16 the CPU time of the server's process (every thread, from /proc) and of the load generator is
divided by the requests answered (for a server of several processes, such as Triton's or Ray's, that of all
the processes of its group too): the null endpoint's is the cost of HTTP alone, which batching cannot save, and
no server carries more requests a second than the null endpoint, so the batching target's figures give that
ceiling too (`ceiling_speedup`: the null endpoint's throughput over the unbatched server's).

The serving targets are checked at the end (`targets`), each with its figures and whether it holds. stderr has
a progress bar; stdout has one JSON object (benchmarks/rounds.py reads its fields), with `--markdown` preceded by tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from fastapi import Request as FastApiRequest  # the FastAPI endpoint's annotation, resolved in this module

from gpuyard.supervisor.ports import free_ports

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


@dataclass(frozen=True)
class Peer:
    script: str
    """Its server in benchmarks/serving_peers/."""
    bodies: tuple[str, ...]
    """The bodies it takes: json, and binary where it speaks the binary tensor extension (then tritonclient too)."""
    ready_path: str | None = None
    """A GET route (`{name}`: the model's) that answers 200 once the model is loaded, for servers whose infer
    route may answer an error other than 404 or 503 while they start; None: the infer route itself is polled.
    Triton's is the model's own: PyTriton loads the model after `tritonserver` starts, and /v2/health/ready
    answers 200 before the model is there."""


PEERS = {
    "kserve": Peer("kserve_server.py", ("json", "binary")),
    "litserve": Peer("litserve_server.py", ("json",)),
    "rayserve": Peer("rayserve_server.py", ("json",)),
    "triton": Peer("triton_server.py", ("json", "binary"), ready_path="/v2/models/{name}/ready"),
}
MODELS = {"mlp": (784, 256, 10), "wide": (1024, 4096, 4096, 1024)}
PLATFORM_PATH = "/_bench/platform"
BUCKETS_US = (25, 50, 100, 150, 200, 300, 500, 1000, 2000, 5000)
"""Upper bounds of the platform-time histogram, in microseconds; a last bucket counts the rest."""
CONTENT_LENGTH = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")
CHUNKED = re.compile(rb"(?i)\r\ntransfer-encoding: *chunked")
HEADER_LENGTH = re.compile(rb"(?i)\r\ninference-header-content-length: *(\d+)")


# --- models and bodies ---------------------------------------------------------------------------------


def mlp_onnx(sizes: tuple[int, ...], seed: int = 0) -> bytes:
    """An MLP x [N, sizes[0]] -> y [N, sizes[-1]] (MatMul + Add, Relu between layers), FP32, random weights."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, weights, last = [], [], "x"
    for i, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
        w = (rng.standard_normal((fan_in, fan_out), dtype=np.float32) / np.sqrt(fan_in)).astype(np.float32)
        weights += [
            numpy_helper.from_array(w, f"w{i}"),
            numpy_helper.from_array(np.zeros(fan_out, np.float32), f"b{i}"),
        ]
        out = "y" if i == len(sizes) - 2 else f"h{i}"
        nodes += [helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"])]
        nodes += [helper.make_node("Add", [f"m{i}", f"b{i}"], [out if out == "y" else f"a{i}"])]
        if out != "y":
            nodes += [helper.make_node("Relu", [f"a{i}"], [out])]
        last = out
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", sizes[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", sizes[-1]])],
        initializer=weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model.SerializeToString()


def sample_input(width: int) -> np.ndarray:
    """The one row every request carries (the same in every process)."""
    return np.random.default_rng(7).standard_normal((1, width), dtype=np.float32)


def json_body(x: np.ndarray) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    ).encode()


def binary_body(x: np.ndarray) -> tuple[bytes, int]:
    """The binary tensor extension's body as tritonclient sends it (binary in, binary out), and its JSON length."""
    raw = x.tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return header + raw, len(header)


# --- the in-tree servers (run as `serving.py --serve KIND`) ---------------------------------------------


class TimedSession:
    """An ONNX Runtime session that records the (start, end) of each `run`."""

    def __init__(self, session):
        self.session = session
        self.runs: list[tuple[float, float]] = []

    def run(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return self.session.run(*args, **kwargs)
        finally:
            self.runs.append((started, time.perf_counter()))

    def __getattr__(self, name):
        return getattr(self.session, name)


class PlatformTimer:
    """ASGI wrapper: each request's (start, end) from the app's call to its last body byte. GET
    /_bench/platform answers, per request since the last such call, the microseconds spent in the app beyond
    `session.run` (exact when requests do not overlap: concurrency 1), and forgets them."""

    def __init__(self, app, session: TimedSession):
        self.app = app
        self.session = session
        self.requests: list[tuple[float, float]] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] == PLATFORM_PATH:
            return await self.answer_platform_time(send)
        started, ended = time.perf_counter(), None

        async def timed_send(message):
            nonlocal ended
            if message["type"] == "http.response.body" and not message.get("more_body"):
                ended = time.perf_counter()
            await send(message)

        await self.app(scope, receive, timed_send)
        self.requests.append((started, ended or time.perf_counter()))

    def beyond_run_us(self) -> list[float]:
        runs = self.session.runs
        out = []
        for started, ended in self.requests:
            inside = sum(max(0.0, min(ended, r_end) - max(started, r_start)) for r_start, r_end in runs)
            out.append((ended - started - inside) * 1e6)
        return out

    async def answer_platform_time(self, send) -> None:
        body = json.dumps(self.beyond_run_us()).encode()
        self.requests.clear()
        self.session.runs.clear()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def gpuyard_app(model_path: str, name: str, max_batch_size: int, max_queue_delay_us: int):
    """GPUYard's v2 app with the model, behind the PlatformTimer."""
    from gpuyard.services.serving.registry import ModelRegistry
    from gpuyard.services.serving.runtime import load_onnx
    from gpuyard.services.serving.v2app import create_app

    model = load_onnx(model_path, intra_op_threads=1)
    model.session = TimedSession(model.session)
    registry = ModelRegistry()
    registry.add(name, 1, model, max_batch_size=max_batch_size, max_queue_delay_us=max_queue_delay_us)
    return PlatformTimer(create_app(registry), model.session)


def null_app(model_path: str, name: str):
    """Starlette answering, on the infer route, GPUYard's own answer to the benchmark's request, encoded once:
    binary when the request is, JSON otherwise. It reads the body and does nothing else."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from gpuyard.services.serving.protocol import encode_response
    from gpuyard.services.serving.runtime import load_onnx

    model = load_onnx(model_path, intra_op_threads=1)
    x = sample_input(model.inputs["x"].shape[1])
    y = model.run({"x": x})["y"]
    as_json, _ = encode_response(name, "1", None, [("y", "FP32", y, False)])
    as_binary, json_length = encode_response(name, "1", None, [("y", "FP32", y, True)])
    binary_headers = {"Inference-Header-Content-Length": str(json_length)}

    async def infer(request: Request) -> Response:
        await request.body()
        if request.headers.get("inference-header-content-length") is None:
            return Response(as_json, media_type="application/json")
        return Response(as_binary, media_type="application/octet-stream", headers=binary_headers)

    return Starlette(routes=[Route("/v2/models/{name}/infer", infer, methods=["POST"])])


def fastapi_app(model_path: str, name: str):
    """A bare FastAPI v2-JSON endpoint: json.loads, numpy, `session.run` in a thread, json.dumps. (In a server
    process, which runs this file as a script: `serving_peers` is beside it on the path.)"""
    from fastapi import FastAPI, Response
    from serving_peers.common import ort_session, v2_inputs, v2_response

    session = ort_session(model_path)
    names = [output.name for output in session.get_outputs()]
    app = FastAPI()

    @app.post("/v2/models/{model}/infer")
    async def infer(model: str, request: FastApiRequest) -> Response:
        feeds = v2_inputs(json.loads(await request.body()))
        results = await asyncio.get_running_loop().run_in_executor(None, session.run, names, feeds)
        body = json.dumps(v2_response(name, dict(zip(names, results, strict=True))))
        return Response(body, media_type="application/json")

    return app


def serve(args: argparse.Namespace) -> int:
    """Server mode: one in-tree server on 127.0.0.1:PORT under uvicorn (one worker, uvloop + httptools)."""
    import uvicorn

    if args.serve == "null":
        app = null_app(args.model, args.name)
    elif args.serve == "fastapi":
        app = fastapi_app(args.model, args.name)
    else:
        app = gpuyard_app(args.model, args.name, args.max_batch_size, args.max_queue_delay_us)
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning", access_log=False, lifespan="off")
    return 0


# --- servers as processes ---------------------------------------------------------------------------------


@dataclass
class Server:
    label: str
    command: list[str]
    port: int
    bodies: tuple[str, ...]
    tritonclient: bool = False
    path: str = ""
    platform_timer: bool = False
    ready_path: str | None = None
    process: subprocess.Popen | None = None
    log: Path | None = None
    figures: dict = field(default_factory=dict)

    def start(self, folder: Path) -> None:
        self.log = folder / f"{self.label}.log"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.process = subprocess.Popen(
            self.command,
            cwd=ROOT,
            env=env,
            stdout=self.log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the peers' workers end with it
        )

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-1500:] if self.log and self.log.exists() else ""


def in_tree_servers(model_path: Path, name: str, ports: list[int], args) -> list[Server]:
    me = [sys.executable, str(Path(__file__).resolve()), "--model", str(model_path), "--name", name]
    batching = [
        "--max-batch-size",
        str(args.max_batch_size),
        "--max-queue-delay-us",
        str(args.max_queue_delay_us),
    ]
    return [
        Server(
            "null",
            [*me, "--serve", "null", "--port", str(ports[0])],
            ports[0],
            ("binary", "json"),
            tritonclient=True,
        ),
        Server("fastapi", [*me, "--serve", "fastapi", "--port", str(ports[1])], ports[1], ("json",)),
        Server(
            "gpuyard",
            [*me, "--serve", "gpuyard", "--port", str(ports[2]), "--max-batch-size", "0"],
            ports[2],
            ("binary", "json"),
            tritonclient=True,
            platform_timer=True,
        ),
        Server(
            "gpuyard_batched",
            [*me, "--serve", "gpuyard", "--port", str(ports[3]), *batching],
            ports[3],
            ("binary", "json"),
            tritonclient=True,
            platform_timer=True,
        ),
    ]


def peer_servers(model_path: Path, name: str, peers: dict[str, str]) -> list[Server]:
    servers = []
    for (peer, python), port in zip(peers.items(), free_ports("127.0.0.1", len(peers)), strict=True):
        spec = PEERS[peer]
        command = [python, str(HERE / "serving_peers" / spec.script), "--model", str(model_path)]
        command += ["--name", name, "--port", str(port)]
        tritonclient = "binary" in spec.bodies
        ready = spec.ready_path.format(name=name) if spec.ready_path else None
        servers.append(Server(peer, command, port, spec.bodies, tritonclient, ready_path=ready))
    return servers


# --- the load generator ----------------------------------------------------------------------------------


class Connection:
    """One keep-alive HTTP/1.1 connection, requests written out by hand (as pipeline.py's Submitter): a general
    HTTP client would cost more CPU per request than the lightest server here spends."""

    def __init__(self, port: int, path: str, binary_json_length: int | None = None):
        self.port = port
        extra = (
            f"Inference-Header-Content-Length: {binary_json_length}\r\nContent-Type: application/octet-stream\r\n"
            if binary_json_length is not None
            else "Content-Type: application/json\r\n"
        )
        self.head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{extra}Content-Length: ".encode()
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, body: bytes, retry: bool = True) -> tuple[int, bytes, bytes]:
        """The answer's status, head and body."""
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(self.head + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
            if CHUNKED.search(head):
                answer = await self.read_chunks()
            else:
                length = CONTENT_LENGTH.search(head)
                answer = await self.reader.readexactly(int(length.group(1)) if length else 0)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.writer = None  # the server closed the connection: open another and send again
            if not retry:
                raise
            return await self.post(body, retry=False)
        return int(head.split(b" ", 2)[1]), head, answer

    async def read_chunks(self) -> bytes:
        parts = []
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size + 2))
        await self.reader.readuntil(b"\r\n")
        return b"".join(p[:-2] for p in parts)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def output_of(head: bytes, body: bytes) -> np.ndarray:
    """The first output of a v2 answer, JSON or binary."""
    binary = HEADER_LENGTH.search(head)
    length = int(binary.group(1)) if binary else len(body)
    tensor = json.loads(body[:length])["outputs"][0]
    if binary:
        return np.frombuffer(body[length:], dtype=np.float32).reshape(tensor["shape"])
    return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])


async def wait_until_answering(server: Server, body: bytes, patience: float) -> None:
    """Until the server answers the infer route with 200 (404 and 503 while it starts are waited out), or its
    readiness route with 200 where it has one (any other answer waited out)."""
    deadline = time.monotonic() + patience
    while True:
        if server.process.poll() is not None:
            raise RuntimeError(f"{server.label} exited ({server.process.returncode}): {server.log_tail()}")
        connection = Connection(server.port, server.ready_path or server.path)
        if server.ready_path:
            connection.head = connection.head.replace(b"POST", b"GET", 1)
        try:
            status, _, answer = await connection.post(b"" if server.ready_path else body, retry=False)
            if status == 200:
                return
            if status not in (404, 503) and not server.ready_path:
                raise RuntimeError(f"{server.label} answered HTTP {status}: {answer[:300]!r}")
        except OSError:
            pass
        finally:
            connection.close()
        if time.monotonic() > deadline:
            raise RuntimeError(f"{server.label} did not answer within {patience:.0f} s: {server.log_tail()}")
        await asyncio.sleep(0.2)


async def check_answer(connection: Connection, body: bytes, expected: np.ndarray, label: str) -> None:
    status, head, answer = await connection.post(body)
    if status != 200:
        raise RuntimeError(f"{label} answered HTTP {status}: {answer[:300].decode(errors='replace')}")
    got = output_of(head, answer)
    if got.shape != expected.shape or not np.allclose(got, expected, rtol=1e-3, atol=1e-4):
        raise RuntimeError(f"{label} answered a wrong output: {got.ravel()[:4]} for {expected.ravel()[:4]}")


async def closed_loop(
    connections: list[Connection], body: bytes, requests: int, seconds: float, tick: Callable[[], None]
) -> tuple[list[float], float]:
    """Each connection sends its next request as soon as the last is answered, until `requests` are done or
    `seconds` have passed: the latencies (s) and the wall time."""
    latencies: list[float] = []
    started = time.perf_counter()
    deadline = started + seconds

    async def keep_sending(connection: Connection) -> None:
        while len(latencies) < requests and time.perf_counter() < deadline:
            sent = time.perf_counter()
            status, _, answer = await connection.post(body)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {answer[:300].decode(errors='replace')}")
            latencies.append(time.perf_counter() - sent)
            tick()

    await asyncio.gather(*(keep_sending(c) for c in connections))
    return latencies, time.perf_counter() - started


def process_cpu_seconds(pid: int) -> float | None:
    """CPU time (user and system) of process `pid` so far, all its threads included, those that have ended too
    (/proc/PID/stat; the per-thread files would miss those); None where /proc is not there. Only the server's own
    process counts: a peer's other processes, such as Ray's or Triton's `tritonserver`, do not (see
    `process_group_cpu_seconds`)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def process_group_cpu_seconds(pgid: int) -> tuple[float, int] | None:
    """CPU time (user and system) so far of the processes alive in process group `pgid` (a server is started as
    the leader of its own), and how many they are; None where /proc is not there. A process that ends between two
    readings takes its time with it: compare two readings only where the group's processes stay up."""
    total, processes = 0, 0
    try:
        entries = [entry for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:  # ended since the listing
            continue
        if int(fields[2]) == pgid:  # pgrp
            total += int(fields[11]) + int(fields[12])
            processes += 1
    return total / os.sysconf("SC_CLK_TCK"), processes


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q / 100 * (len(ordered) - 1))))]


def latency_figures(seconds: list[float], wall: float | None = None) -> dict:
    figures = {
        "requests": len(seconds),
        "p50_ms": round(percentile(seconds, 50) * 1e3, 3),
        "p95_ms": round(percentile(seconds, 95) * 1e3, 3),
        "p99_ms": round(percentile(seconds, 99) * 1e3, 3),
    }
    if wall:
        figures["throughput_per_s"] = round(len(seconds) / wall, 1)
    return figures


def histogram(values_us: list[float]) -> dict:
    """p50/p90/p99 and counts per bucket of BUCKETS_US (`le`, not cumulative; `+Inf` the rest)."""
    counts = [0] * (len(BUCKETS_US) + 1)
    for value in values_us:
        counts[next((i for i, bound in enumerate(BUCKETS_US) if value <= bound), len(BUCKETS_US))] += 1
    return {
        "requests": len(values_us),
        "p50_ms": round(percentile(values_us, 50) / 1e3, 3),
        "p90_ms": round(percentile(values_us, 90) / 1e3, 3),
        "p99_ms": round(percentile(values_us, 99) / 1e3, 3),
        "histogram_us": {
            **{f"le_{b}": c for b, c in zip(BUCKETS_US, counts, strict=False)},
            "+Inf": counts[-1],
        },
    }


async def platform_time(port: int) -> list[float]:
    connection = Connection(port, PLATFORM_PATH)
    try:
        connection.head = connection.head.replace(b"POST", b"GET", 1)
        _, _, answer = await connection.post(b"")
        return json.loads(answer)
    finally:
        connection.close()


# --- one model --------------------------------------------------------------------------------------------


@dataclass
class Bench:
    args: argparse.Namespace
    progress: object
    task: object

    def tick(self) -> None:
        self.progress.advance(self.task)

    def say(self, text: str) -> None:
        self.progress.update(self.task, description=text)


def measure_session_run(model_path: Path, x: np.ndarray, bench: Bench) -> dict:
    """The bare in-process `session.run`, one row and a batch of 16 rows."""
    from gpuyard.services.serving.runtime import load_onnx

    session = load_onnx(str(model_path), intra_op_threads=1).session
    figures = {}
    for label, feed in (("c1", x), ("batch16", np.repeat(x, 16, axis=0))):
        for _ in range(20):
            session.run(["y"], {"x": feed})
        times, deadline = [], time.perf_counter() + bench.args.seconds
        while len(times) < bench.args.requests and time.perf_counter() < deadline:
            started = time.perf_counter()
            session.run(["y"], {"x": feed})
            times.append(time.perf_counter() - started)
        figures[label] = latency_figures(times)
    return figures


async def measure_http(server: Server, body: bytes, json_length, expected, bench: Bench) -> dict:
    """Concurrency 1 then `--concurrency`, each after a warm-up, on the hand-written client."""
    args = bench.args
    connections = [Connection(server.port, server.path, json_length) for _ in range(args.concurrency)]
    try:
        await check_answer(connections[0], body, expected, server.label)
        await closed_loop(connections[:1], body, args.warmup, args.seconds, bench.tick)
        await closed_loop(connections, body, args.warmup, args.seconds, bench.tick)
        if server.platform_timer:
            await platform_time(server.port)  # forget the warm-up
        c1 = latency_figures(
            *await closed_loop(connections[:1], body, args.requests, args.seconds, bench.tick)
        )
        figures = {"c1": c1}
        if server.platform_timer:
            figures["platform_beyond_run"] = histogram(await platform_time(server.port))
        pid = server.process.pid
        server_cpu, group_cpu = process_cpu_seconds(pid), process_group_cpu_seconds(pid)
        client_cpu = time.process_time()
        latencies, wall = await closed_loop(connections, body, args.requests, args.seconds, bench.tick)
        heavy = figures[f"c{args.concurrency}"] = latency_figures(latencies, wall)
        if server_cpu is not None and (after := process_cpu_seconds(pid)) is not None:
            heavy["server_cpu_us_per_request"] = round((after - server_cpu) / len(latencies) * 1e6, 1)
        group_after = process_group_cpu_seconds(pid) if group_cpu is not None else None
        if group_after is not None and group_after[1] > 1:  # several processes: tritonserver's, Ray's too
            used = group_after[0] - group_cpu[0]
            heavy["server_group_cpu_us_per_request"] = round(used / len(latencies) * 1e6, 1)
            heavy["server_group_processes"] = group_after[1]
        heavy["client_cpu_us_per_request"] = round(
            (time.process_time() - client_cpu) / len(latencies) * 1e6, 1
        )
        return figures
    finally:
        for connection in connections:
            connection.close()


def measure_tritonclient(server: Server, name: str, x: np.ndarray, expected, bench: Bench) -> dict:
    """tritonclient.http's `infer` (binary in and out, its defaults) at concurrency 1."""
    import tritonclient.http as triton

    client = triton.InferenceServerClient(
        f"127.0.0.1:{server.port}", connection_timeout=60, network_timeout=60
    )
    try:
        tensor = triton.InferInput("x", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        got = client.infer(name, [tensor]).as_numpy("y")
        if not np.allclose(got, expected, rtol=1e-3, atol=1e-4):
            raise RuntimeError(f"{server.label} answered tritonclient a wrong output")
        for _ in range(bench.args.warmup):
            client.infer(name, [tensor])
        if server.platform_timer:
            asyncio.run(platform_time(server.port))
        times, deadline = [], time.perf_counter() + bench.args.seconds
        while len(times) < bench.args.requests and time.perf_counter() < deadline:
            started = time.perf_counter()
            client.infer(name, [tensor])
            times.append(time.perf_counter() - started)
            bench.tick()
        figures = {"c1": latency_figures(times)}
        if server.platform_timer:
            figures["platform_beyond_run"] = histogram(asyncio.run(platform_time(server.port)))
        return figures
    finally:
        client.close()


def measure_server(server: Server, name: str, x: np.ndarray, expected: np.ndarray, bench: Bench) -> dict:
    bodies = {"json": (json_body(x), None), "binary": binary_body(x)}
    figures: dict = {}
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(wait_until_answering(server, bodies["json"][0], bench.args.start_timeout))
        for kind in server.bodies:
            bench.say(f"{name}: {server.label} ({kind})")
            figures[kind] = runner.run(measure_http(server, *bodies[kind], expected, bench))
    if server.tritonclient:
        bench.say(f"{name}: {server.label} (tritonclient)")
        figures["tritonclient"] = measure_tritonclient(server, name, x, expected, bench)
    return figures


def loop_factory():
    from gpuyard.shared.runtime.service import event_loop_factory

    return event_loop_factory()


def measure_model(
    name: str, sizes: tuple[int, ...], folder: Path, peers: dict[str, str], bench: Bench
) -> dict:
    """Every server for one model, one at a time (each started, measured, stopped)."""
    model_path = folder / f"{name}.onnx"
    model_path.write_bytes(mlp_onnx(sizes))
    x = sample_input(sizes[0])
    bench.say(f"{name}: session.run")
    result: dict = {
        "request_bytes": {"json": len(json_body(x)), "binary": len(binary_body(x)[0])},
        "session_run": measure_session_run(model_path, x, bench),
        "servers": {},
    }
    from gpuyard.services.serving.runtime import load_onnx

    expected = load_onnx(str(model_path)).run({"x": x})["y"]
    servers = in_tree_servers(model_path, name, free_ports("127.0.0.1", 4), bench.args)
    servers += peer_servers(model_path, name, peers)
    for server in servers:
        server.path = f"/v2/models/{name}/infer"
        bench.say(f"{name}: starting {server.label}")
        server.start(folder)
        try:
            result["servers"][server.label] = measure_server(server, name, x, expected, bench)
        except Exception as exc:  # a peer that fails is reported, the others still measured
            if not server.label.startswith(tuple(PEERS)):
                raise
            result["servers"][server.label] = {"error": str(exc)[-800:]}
        finally:
            server.stop()
    return result


# --- targets ------------------------------------------------------------------------------------------------


def pick(doc: dict, *path: str):
    for key in path:
        if not isinstance(doc, dict) or key not in doc:
            return None
        doc = doc[key]
    return doc


def check(figures: dict, holds) -> dict:
    return {**figures, "holds": holds}


def all_hold(checks: list[dict]) -> bool | None:
    """False if any check fails, None (not measured) if any could not be made, else True."""
    verdicts = [c["holds"] for c in checks]
    if False in verdicts:
        return False
    return None if None in verdicts or not verdicts else True


def targets_of_model(name: str, model: dict, concurrency: int) -> dict:
    servers = model["servers"]
    gy = servers["gpuyard"]
    out: dict = {}

    null_p50 = pick(servers, "null", "tritonclient", "c1", "p50_ms")
    gy_p50 = pick(gy, "tritonclient", "c1", "p50_ms")
    diff = round(gy_p50 - null_p50, 3)
    out["binary_tritonclient_p50_within_0_3ms_of_null"] = check(
        {"gpuyard_p50_ms": gy_p50, "null_p50_ms": null_p50, "difference_ms": diff, "limit_ms": 0.3},
        diff <= 0.3,
    )

    fa = pick(servers, "fastapi", "json", "c1", "p50_ms")
    gj = pick(gy, "json", "c1", "p50_ms")
    ratio = round(gj / fa, 3)
    out["json_p50_within_10pct_of_fastapi"] = check(
        {"gpuyard_p50_ms": gj, "fastapi_p50_ms": fa, "ratio": ratio, "limit_ratio": 1.1}, ratio <= 1.1
    )

    peers = {label: f for label, f in servers.items() if label in PEERS}
    comparisons = []
    for label, figures in peers.items():
        if "error" in figures:
            comparisons.append(check({"peer": label, "error": "did not run"}, None))
            continue
        peer_json = pick(figures, "json", "c1", "p50_ms")
        peer_best = min(pick(figures, kind, "c1", "p50_ms") for kind in figures if kind in ("json", "binary"))
        gb = pick(gy, "binary", "c1", "p50_ms")
        comparisons.append(
            check(
                {"peer": label, "gpuyard_json_p50_ms": gj, "peer_json_p50_ms": peer_json},
                gj < peer_json if peer_json is not None else None,
            )
        )
        comparisons.append(
            check({"peer": label, "gpuyard_binary_p50_ms": gb, "peer_best_p50_ms": peer_best}, gb < peer_best)
        )
    out["lower_than_every_peer"] = {
        "checks": comparisons,
        "holds": all_hold(comparisons) if comparisons else None,
    }
    if not comparisons:
        out["lower_than_every_peer"]["note"] = "no peer measured"

    platform_checks = []
    for kind in ("binary", "json", "tritonclient"):
        p50 = pick(gy, kind, "platform_beyond_run", "p50_ms")
        platform_checks.append(check({"path": kind, "p50_ms": p50, "limit_ms": 0.3}, p50 <= 0.3))
    out["platform_beyond_run_p50_le_0_3ms"] = {"checks": platform_checks, "holds": all_hold(platform_checks)}

    c = f"c{concurrency}"
    batching_checks = []
    for kind in ("binary", "json"):
        off, on = pick(gy, kind, c), pick(servers, "gpuyard_batched", kind, c)
        null = pick(servers, "null", kind, c) or {}
        speedup = round(on["throughput_per_s"] / off["throughput_per_s"], 2)
        figures = {
            "path": kind,
            "unbatched_per_s": off["throughput_per_s"],
            "batched_per_s": on["throughput_per_s"],
            "speedup": speedup,
            "limit_speedup": 3.0,
            "unbatched_p95_ms": off["p95_ms"],
            "batched_p95_ms": on["p95_ms"],
        }
        if "throughput_per_s" in null:  # no server carries more than the null endpoint, which does nothing
            figures["null_per_s"] = null["throughput_per_s"]
            figures["ceiling_speedup"] = round(null["throughput_per_s"] / off["throughput_per_s"], 2)
        for label, f in (("null", null), ("unbatched", off), ("batched", on)):
            if "server_cpu_us_per_request" in f:
                figures[f"{label}_server_cpu_us_per_request"] = f["server_cpu_us_per_request"]
        batching_checks.append(check(figures, speedup >= 3.0 and on["p95_ms"] < off["p95_ms"]))
    batching = out[f"dynamic_batching_3x_throughput_lower_p95_at_{c}"] = {
        "checks": batching_checks,
        "holds": all_hold(batching_checks),
    }
    if name != "mlp":  # what batching does where the model, not HTTP, is most of a request's time
        batching["note"] = "this target is set on the small model (mlp) only"
    return out


# --- output -------------------------------------------------------------------------------------------------


def markdown(result: dict) -> str:
    c = f"c{result['config']['concurrency']}"
    lines = []
    for name, model in result["models"].items():
        run = model["session_run"]
        lines += [
            f"\n### {name} (session.run p50 {run['c1']['p50_ms']} ms, batch of 16 {run['batch16']['p50_ms']} ms)\n",
            f"| server | path | c1 p50 ms | c1 p99 ms | {c} req/s | {c} p95 ms | {c} server CPU µs/request "
            "| beyond run p50 ms |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for label, figures in model["servers"].items():
            if "error" in figures:
                lines.append(f"| {label} | failed: {figures['error'][:80]!r} | | | | | | |")
                continue
            for kind, f in figures.items():
                heavy = f.get(c, {})
                beyond = pick(f, "platform_beyond_run", "p50_ms")
                cpu = str(heavy.get("server_cpu_us_per_request", ""))
                if "server_group_cpu_us_per_request" in heavy:
                    cpu += f" ({heavy['server_group_processes']} processes: {heavy['server_group_cpu_us_per_request']})"
                lines.append(
                    f"| {label} | {kind} | {f['c1']['p50_ms']} | {f['c1']['p99_ms']} | "
                    f"{heavy.get('throughput_per_s', '')} | {heavy.get('p95_ms', '')} | "
                    f"{cpu} | {'' if beyond is None else beyond} |"
                )
    lines += ["\n### Targets\n", "| model | target | holds |", "| --- | --- | --- |"]
    for name, targets in result["targets"].items():
        for target, verdict in targets.items():
            lines.append(f"| {name} | {target} | {verdict['holds']} |")
    return "\n".join(lines)


def parse_peers(given: list[str], parser: argparse.ArgumentParser) -> dict[str, str]:
    peers = {}
    for item in given:
        peer, _, python = item.partition("=")
        if peer not in PEERS or not python:
            parser.error(f"--peer takes NAME=PYTHON with NAME one of {', '.join(PEERS)}")
        peers[peer] = python
    return peers


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement (at most)")
    parser.add_argument("--seconds", type=float, default=5.0, help="seconds per measurement (at most)")
    parser.add_argument("--warmup", type=int, default=100, help="requests sent before each measurement")
    parser.add_argument("--concurrency", type=int, default=16, help="connections for the throughput figures")
    parser.add_argument("--models", default=",".join(MODELS), help=f"among {', '.join(MODELS)}")
    parser.add_argument(
        "--peer", action="append", default=[], metavar="NAME=PYTHON", help="a peer and its interpreter"
    )
    parser.add_argument("--max-batch-size", type=int, default=16, help="gpuyard_batched's batch")
    parser.add_argument("--max-queue-delay-us", type=int, default=0, help="gpuyard_batched's delay")
    parser.add_argument(
        "--start-timeout", type=float, default=180, help="seconds a server may take to answer"
    )
    parser.add_argument("--markdown", action="store_true", help="also print tables after the JSON")
    parser.add_argument("--serve", choices=["null", "fastapi", "gpuyard"], help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve(args)
    peers = parse_peers(args.peer, parser)
    models = [m for m in args.models.split(",") if m]
    if unknown := [m for m in models if m not in MODELS]:
        parser.error(f"unknown model {unknown[0]}: choose among {', '.join(MODELS)}")
    import onnxruntime
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    result: dict = {
        "config": {
            "requests": args.requests,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "concurrency": args.concurrency,
            "max_batch_size": args.max_batch_size,
            "max_queue_delay_us": args.max_queue_delay_us,
            "onnxruntime": onnxruntime.__version__,
            "intra_op_threads": 1,
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_before": round(os.getloadavg()[0], 2),
        },
        "peers": {p: "measured" if p in peers else f"skipped: no --peer {p}=PYTHON given" for p in PEERS},
        "models": {},
    }
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with (
        tempfile.TemporaryDirectory(prefix="gpuyard-serving-bench-") as tmp,
        Progress(*columns, console=Console(stderr=True)) as progress,
    ):
        task = progress.add_task("starting", total=None)
        bench = Bench(args, progress, task)
        for name in models:
            result["models"][name] = measure_model(name, MODELS[name], Path(tmp), peers, bench)
    result["targets"] = {n: targets_of_model(n, m, args.concurrency) for n, m in result["models"].items()}
    if args.markdown:  # before the JSON, which stays the last thing on stdout (benchmarks/rounds.py)
        print(markdown(result) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
