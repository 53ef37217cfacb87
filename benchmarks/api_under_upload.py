"""How long another tenant waits for `GET /v1/jobs` while one tenant publishes a large model: first while its
body streams in, then while the file is checked; while a model of deeply nested `If` subgraphs is checked; and
while a third tenant sends oversized inference requests to the serving port, alone and then beside the large
model's publish.

    python benchmarks/api_under_upload.py                      # a 1 GiB model, a nested one of about 70 MiB
    python benchmarks/api_under_upload.py --model-mb 256 --nested-depth 0   # smaller, no nested model
    python benchmarks/api_under_upload.py --content-length     # bodies that say their length (not chunked)
    python benchmarks/api_under_upload.py --no-inference       # without the serving port's phases

The submit API runs as it does in production (uvicorn, its own process, the services' event loop), on an
embedded store in a temporary folder, with no bus (publishing needs none). So does the serving entry point (its
own process, `gpuyard.services.serving.entry`: bearer tokens, the request limits, `--request-limit-mb` as
`max_request_bytes`), holding tenant `speech`'s model `wide` (x [N, 4096] FP32, whose inputs bound no request
below the limit: the limit binds) as a replica placed on its node would be held. Tenant `nlp` has `--jobs` jobs
queued and lists them (its first page) one request after another, the whole time; tenant `vision` streams the
model from a file written beforehand (1 MiB chunks) and waits for the answer. Each listing's latency is put in
the phase it began in: `quiet` (before the upload), `upload` (body streaming), `check` (body sent, answer not yet
in). Then tenant `speech` sends inference requests to `wide`, one after another: each a JSON body of more rows
than the limit holds, chunked (1 MiB chunks) as a streaming client sends it, its bytes sent until the limit is
passed and the answer read, a 413 in the protocol's shape; phases `inference` (those alone, for
`--inference-seconds`), then `upload+inference` and `check+inference` (the large model published again, under
another name, while they go on).

Prints one JSON object: per phase, the listings' count, p50, p99 and max in milliseconds; each publish's status,
size and seconds; the API process's peak resident memory; and `with_inference` (the serving phases: the
listings, the publish, the inference requests' statuses per phase, the serving process's peak resident memory).
Exits 1 when a publish was not answered 201, a listing failed, or an inference request was answered anything but
its 413.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]

TOKENS = "tok-vision=vision:ana,tok-nlp=nlp:bo,tok-speech=speech:cy"
UPLOADER = {"Authorization": "Bearer tok-vision", "Content-Type": "application/octet-stream"}
LISTER = {"Authorization": "Bearer tok-nlp"}
INFERRER = {"Authorization": "Bearer tok-speech", "Content-Type": "application/json"}
CHUNK = 1 << 20
SERVED = ("speech", "wide")  # the served model's tenant and name
WIDE_INPUTS = 4096


# ---------------------------------------------------------------- the API, in a process of its own


async def serve(folder: Path, port: int, max_model_bytes: int) -> None:
    import uvicorn

    from gpuyard.services.submit.app import create_app
    from gpuyard.services.submit.context import SubmitContext, Uploads
    from gpuyard.shared.auth.tokens import Tokens
    from gpuyard.shared.modelfiles.signature import CheckBounds
    from gpuyard.shared.modelfiles.store import ModelStore
    from gpuyard.shared.stores.events import open_store
    from gpuyard.shared.stores.ledger import JobLedger
    from gpuyard.shared.stores.logs import open_log_store
    from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry

    store = await open_store(f"sqlite:///{folder / 'events.db'}")
    logs = await open_log_store(f"sqlite:///{folder / 'logs.db'}")
    ctx = SubmitContext(
        store=store,
        ledger=JobLedger(store, None, "/bench"),
        tokens=Tokens(None, TOKENS),
        logs=logs,
        models=ModelRegistry(store, None, "/bench", ModelStore(str(folder / "models"))),
        max_model_bytes=max_model_bytes,
        accept_unplaceable=True,
        uploads=Uploads(limit=2),
        model_check=CheckBounds(seconds=600, memory_bytes=max(4 << 30, 4 * max_model_bytes)),
    )
    config = uvicorn.Config(
        create_app(ctx), host="127.0.0.1", port=port, log_level="warning", access_log=False
    )
    await uvicorn.Server(config).serve()


async def serve_inference(folder: Path, port: int, max_request_bytes: int, model_path: Path) -> None:
    """The serving entry point as `gpuyard.services.serving.main` builds it, without the bus: the model is held as the
    serving service holds a serve job's replica once loaded (its registry key, ONNX Runtime at one thread)."""
    import uvicorn

    from gpuyard.services.serving.access import Access
    from gpuyard.services.serving.entry import create_entry_app
    from gpuyard.services.serving.held import model_key
    from gpuyard.services.serving.proxy import Forwarder
    from gpuyard.services.serving.registry import ModelRegistry
    from gpuyard.services.serving.routing import Routes
    from gpuyard.services.serving.runtime import load_onnx
    from gpuyard.services.serving.stats import Stats
    from gpuyard.shared.auth.tokens import Tokens
    from gpuyard.shared.modelfiles.store import ModelStore
    from gpuyard.shared.stores.events import open_store
    from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry as ModelCatalog

    store = await open_store(f"sqlite:///{folder / 'events.db'}")
    catalog = ModelCatalog(store, None, "/bench", ModelStore(str(folder / "models")))
    registry, routes = ModelRegistry(), Routes("bench")
    registry.add(model_key(*SERVED), 1, load_onnx(model_path, intra_op_threads=1))
    app = create_entry_app(
        registry,
        Access(Tokens(None, TOKENS), catalog, registry, routes),
        Forwarder(registry, routes),
        Stats(),
        max_request_bytes=max_request_bytes,
    )
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    await uvicorn.Server(config).serve()


def start_process(what: str, argv: list[str], health: str) -> tuple[subprocess.Popen, str]:
    """This file run with `argv` (a server on a free port, given last): its process and URL once `health`
    answers 200."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, __file__, *argv, str(port)], cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}{health}", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{what} did not start within 60 s")


def start_api(folder: Path, max_model_bytes: int) -> tuple[subprocess.Popen, str]:
    return start_process("the API", ["--serve", str(folder), str(max_model_bytes)], "/healthz")


def start_serving(folder: Path, max_request_bytes: int, model: Path) -> tuple[subprocess.Popen, str]:
    argv = ["--serve-inference", str(folder), str(max_request_bytes), str(model)]
    return start_process("the serving entry point", argv, "/v2/health/ready")


# ---------------------------------------------------------------- models


def sized_model(path: Path, megabytes: int) -> None:
    """A valid model of about `megabytes` MiB: y = x + w, w one large initializer."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    n = megabytes * (1 << 20) // 4
    w = numpy_helper.from_array(np.ones(n, dtype=np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [n])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [n])
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "big", [x], [y], initializer=[w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))


def nested_model(path: Path, depth: int, width: int) -> None:
    """`If` nodes nested `depth` deep, both branches of each holding `width` nodes and the next `If`: 2**depth
    subgraphs, which the checker walks one by one."""
    import onnx
    from onnx import TensorProto, helper

    graph = None
    for level in range(depth, -1, -1):
        nodes = [helper.make_node("Identity", ["x" if i == 0 else f"i{level}_{i - 1}"], [f"i{level}_{i}"])
                 for i in range(width)]  # fmt: skip
        if graph is not None:
            nodes.append(helper.make_node("If", ["c"], [f"o{level}"], then_branch=graph, else_branch=graph))
        else:
            nodes.append(helper.make_node("Identity", [f"i{level}_{width - 1}"], [f"o{level}"]))
        out = helper.make_tensor_value_info(f"o{level}", TensorProto.FLOAT, [1])
        graph = helper.make_graph(nodes, f"g{level}", [], [out])
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    c = helper.make_tensor_value_info("c", TensorProto.BOOL, [])
    main = helper.make_graph(list(graph.node), "main", [x, c], [graph.output[0]])
    model = helper.make_model(main, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))


def wide_model(path: Path, width: int = WIDE_INPUTS) -> None:
    """y = x @ w, x [N, width] FP32, w [width, 4]: at the serving port's most rows a request may carry, its
    inputs allow more than any limit given here, so `max_request_bytes` is what binds."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.full((width, 4), 0.5, dtype=np.float32), "w")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", width])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "wide", [x], [y], initializer=[w]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save_model(model, str(path))


# ---------------------------------------------------------------- the measure


class Lister(threading.Thread):
    """`GET /v1/jobs` as tenant nlp, one after another, each latency with the phase it began in."""

    def __init__(self, url: str):
        super().__init__(daemon=True)
        self.url = url
        self.phase = "quiet"
        self.samples: dict[str, list[float]] = {}
        self.failures = 0
        self.done = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, headers=LISTER, timeout=600) as client:
            while not self.done.is_set():
                phase, started = self.phase, time.perf_counter()
                response = client.get("/v1/jobs", params={"limit": 50})
                elapsed = time.perf_counter() - started
                if response.status_code != 200:
                    self.failures += 1
                self.samples.setdefault(phase, []).append(elapsed)
                time.sleep(0.005)  # (a client that asks 200 times a second, not a busy loop)


def publish(
    url: str,
    path: Path,
    name: str,
    lister: Lister,
    chunked: bool,
    phases: tuple[str, str, str] = ("upload", "check", "quiet"),
) -> dict:
    """Stream `path` as model `name` (`chunked`: without saying its length); the lister's phase follows the
    upload (`phases`: its names while the body streams, once it is sent, and once the answer is in)."""
    size = path.stat().st_size

    def body():
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
        lister.phase = phases[1]  # (the last byte handed to the connection)

    lister.phase = phases[0]
    started = time.perf_counter()
    response = httpx.post(
        f"{url}/v1/models",
        params={"name": name},
        content=body(),
        headers={**UPLOADER, **({} if chunked else {"Content-Length": str(size)})},
        timeout=3600,
    )
    seconds = time.perf_counter() - started
    lister.phase = phases[2]
    return {"name": name, "status": response.status_code, "bytes": size, "seconds": round(seconds, 2),
            "detail": response.json().get("detail") if response.status_code >= 400 else None}  # fmt: skip


class Inferrer(threading.Thread):
    """Tenant speech's oversized inference requests to the serving port, one after another, each with the
    lister's phase when it began: a JSON request of more rows of `wide` than `limit` bytes hold, chunked, its
    bytes sent until the limit is passed, then its answer read (a 413 is all it should get)."""

    def __init__(self, url: str, limit: int, lister: Lister):
        super().__init__(daemon=True)
        self.address = ("127.0.0.1", int(url.rsplit(":", 1)[1]))
        self.limit = limit
        self.lister = lister
        self.statuses: dict[str, collections.Counter] = {}
        self.seconds: list[float] = []
        self.unexpected: list[str] = []
        self.done = threading.Event()
        rows = limit // (WIDE_INPUTS * len("0.125, ")) + 1024  # (more than the limit holds)
        start = json.dumps(
            {"inputs": [{"name": "x", "datatype": "FP32", "shape": [rows, WIDE_INPUTS], "data": []}]}
        )
        prefix = start[: start.rindex("[]") + 1].encode()  # `"data": [` and the numbers to come
        filler = b"0.125, " * (CHUNK // 7 + 1)
        self.first = frame((prefix + filler)[:CHUNK])
        self.next = frame(filler[:CHUNK])
        self.head = "\r\n".join(
            [
                f"POST /v2/models/{SERVED[1]}/infer HTTP/1.1",
                f"Host: {self.address[0]}:{self.address[1]}",
                *(f"{k}: {v}" for k, v in INFERRER.items()),
                "Transfer-Encoding: chunked",
                "",
                "",
            ]
        ).encode()
        self.sent_each = 0

    def run(self) -> None:
        while not self.done.is_set():
            phase, started = self.lister.phase, time.perf_counter()
            status = self.one()
            self.seconds.append(time.perf_counter() - started)
            self.statuses.setdefault(phase, collections.Counter())[status] += 1

    def one(self) -> str:
        try:
            with socket.create_connection(self.address, timeout=600) as sock:
                sock.sendall(self.head + self.first)
                sent = CHUNK
                while sent <= self.limit:  # past the limit, then nothing more: the server has all it needs
                    sock.sendall(self.next)
                    sent += CHUNK
                self.sent_each = sent
                status, body = read_answer(sock)
        except OSError as exc:  # (a reset, or the answer never came)
            self.unexpected.append(repr(exc))
            return type(exc).__name__
        if status != 413 or not refused_over(body, self.limit):
            self.unexpected.append(f"{status} {body[:200]!r}")
        return str(status)

    def report(self) -> dict:
        return {
            "statuses": {phase: dict(counts) for phase, counts in self.statuses.items()},
            "bytes_sent_each": self.sent_each,
            "seconds": {k: v for k, v in summary(self.seconds).items() if k != "count"},
            "unexpected": self.unexpected[:5],
        }


def refused_over(body: bytes, limit: int) -> bool:
    """Whether `body` is the protocol's error (`{"error": ...}`, nothing else) saying the body passed `limit`."""
    try:
        answer = json.loads(body)
    except ValueError:
        return False
    return isinstance(answer, dict) and set(answer) == {"error"} and f"over {limit} bytes" in answer["error"]


def frame(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def read_answer(sock: socket.socket) -> tuple[int, bytes]:
    """The status and body of the answer on `sock` (one with a Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed with no answer: {data[:200]!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed in the middle of the answer")
        body += chunk
    return int(head.split(b" ", 2)[1]), body


def peak_rss(pid: int) -> float | None:
    """A process's largest resident size so far, in MiB (Linux's VmHWM; None elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def summary(samples: list[float]) -> dict:
    ms = sorted(s * 1000 for s in samples)
    if not ms:
        return {"count": 0}
    p99 = ms[min(len(ms) - 1, round(0.99 * (len(ms) - 1)))]
    return {"count": len(ms), "p50_ms": round(statistics.median(ms), 2), "p99_ms": round(p99, 2),
            "max_ms": round(ms[-1], 2)}  # fmt: skip


def queue_jobs(url: str, count: int) -> None:
    with httpx.Client(base_url=url, headers=LISTER, timeout=60) as client:
        for k in range(count):
            spec = {"name": f"job-{k}", "command": "sleep 1", "resources": {"gpus": 1}}
            assert client.post("/v1/jobs", json=spec).status_code == 202


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-mb", type=int, default=1000, help="the large model's size (default 1000 MiB)"
    )
    parser.add_argument(
        "--nested-depth", type=int, default=15, help="If levels of the nested model (0: none)"
    )
    parser.add_argument("--nested-width", type=int, default=40, help="nodes per level of the nested model")
    parser.add_argument("--jobs", type=int, default=50, help="jobs tenant nlp has queued")
    parser.add_argument("--quiet-seconds", type=float, default=3.0)
    parser.add_argument(
        "--content-length", action="store_true", help="say each body's length (default: chunked, as streamed)"
    )
    parser.add_argument(
        "--no-inference", action="store_true", help="leave out the phases with oversized inference requests"
    )
    parser.add_argument(
        "--request-limit-mb",
        type=int,
        help="the serving port's max_request_bytes, in MiB (default: the setting's default, 64 MiB)",
    )
    parser.add_argument(
        "--inference-seconds",
        type=float,
        default=5.0,
        help="oversized inference requests alone, before the publish",
    )
    args = parser.parse_args()
    from gpuyard.shared.settings.serving import ServingSettings

    default_limit = ServingSettings.model_fields["max_request_bytes"].default
    args.request_limit = args.request_limit_mb << 20 if args.request_limit_mb else default_limit
    with tempfile.TemporaryDirectory(prefix="gpuyard-upload-bench-") as tmp:
        folder = Path(tmp)
        big = folder / "big.onnx"
        sized_model(big, args.model_mb)
        files = [("big", big)]
        if args.nested_depth > 0:
            nested = folder / "nested.onnx"
            nested_model(nested, args.nested_depth, args.nested_width)
            files.append(("nested", nested))
        api_folder = folder / "api"
        api_folder.mkdir()
        limit = max(p.stat().st_size for _, p in files) + (1 << 20)
        serving = serving_url = None
        started: list[subprocess.Popen] = []
        try:
            if not args.no_inference:
                wide = folder / "wide.onnx"
                wide_model(wide)
                (folder / "serving").mkdir()
                serving, serving_url = start_serving(folder / "serving", args.request_limit, wide)
                started.append(serving)
                check_inference(serving_url)
            proc, url = start_api(api_folder, limit)
            started.append(proc)
            queue_jobs(url, args.jobs)
            lister = Lister(url)
            lister.start()
            time.sleep(args.quiet_seconds)  # (the quiet phase's samples)
            published = []
            for name, path in files:
                published.append(publish(url, path, name, lister, chunked=not args.content_length))
                phases = {phase: summary(s) for phase, s in lister.samples.items()}
                published[-1]["listings"] = {p: phases.get(p, {"count": 0}) for p in ("upload", "check")}
                lister.samples = {"quiet": lister.samples.get("quiet", [])}
            with_inference = None
            if serving is not None:
                with_inference = inference_phases(serving_url, args, big, url, lister)
                with_inference["serving_peak_rss_mb"] = peak_rss(serving.pid)
            lister.done.set()
            lister.join()
            peak = peak_rss(proc.pid)
        finally:
            for server in started:
                server.terminate()
                server.wait(30)
    result = {
        "cpus": os.cpu_count(),
        "model_mb": args.model_mb,
        "chunked": not args.content_length,
        "jobs_listed": args.jobs,
        "quiet": summary(lister.samples.get("quiet", [])),
        "publishes": published,
        "listing_failures": lister.failures,
        "api_peak_rss_mb": peak,
        "event_loop": "uvloop" if loop_factory() else "asyncio",
    }
    if with_inference is not None:
        result["with_inference"] = with_inference
        published = [*published, with_inference["publish"]]
    print(json.dumps(result, indent=2))
    inferences_ok = with_inference is None or (
        not with_inference["inferences"]["unexpected"]
        and "inference" in with_inference["inferences"]["statuses"]
        and {"upload+inference", "check+inference"} & set(with_inference["inferences"]["statuses"])
    )
    return 0 if lister.failures == 0 and all(p["status"] == 201 for p in published) and inferences_ok else 1


def check_inference(url: str) -> None:
    """Tenant speech's model answers a small request on the serving port (else the phases would measure
    refusals of another kind)."""
    body = {
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [2, WIDE_INPUTS], "data": [0.5] * 2 * WIDE_INPUTS}
        ]
    }
    answer = httpx.post(f"{url}/v2/models/{SERVED[1]}/infer", json=body, headers=INFERRER, timeout=60)
    if answer.status_code != 200:
        raise SystemExit(f"the serving entry point answered {answer.status_code}: {answer.text[:300]}")


def inference_phases(serving_url: str, args, big: Path, url: str, lister: Lister) -> dict:
    """Oversized inference requests alone (`inference`), then beside the large model's publish under another
    name (`upload+inference`, `check+inference`): the listings of each phase, the publish, the requests."""
    inferrer = Inferrer(serving_url, args.request_limit, lister)
    lister.phase = "inference"
    inferrer.start()
    time.sleep(args.inference_seconds)  # (the phase's samples)
    phases = ("upload+inference", "check+inference")
    done = publish(
        url, big, "big-beside-inference", lister, not args.content_length, (*phases, "inference-ends")
    )
    inferrer.done.set()
    inferrer.join()  # (the request under way ends; what the lister measures meanwhile is left out)
    lister.phase = "quiet"
    listings = {phase: summary(lister.samples.get(phase, [])) for phase in ("inference", *phases)}
    lister.samples = {"quiet": lister.samples.get("quiet", [])}
    done["listings"] = {phase: listings[phase] for phase in phases}
    return {
        "request_limit_bytes": args.request_limit,
        "model": "/".join(SERVED),
        "inference": listings["inference"],
        "publish": done,
        "inferences": inferrer.report(),
    }


def loop_factory():
    """The services' event loop (`gpuyard.shared.runtime.service.event_loop_factory`: uvloop where installed)."""
    from gpuyard.shared.runtime.service import event_loop_factory

    return event_loop_factory()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(serve(Path(sys.argv[2]), int(sys.argv[4]), int(sys.argv[3])))
    elif sys.argv[1:2] == ["--serve-inference"]:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            runner.run(
                serve_inference(Path(sys.argv[2]), int(sys.argv[5]), int(sys.argv[3]), Path(sys.argv[4]))
            )
    else:
        sys.exit(main())
