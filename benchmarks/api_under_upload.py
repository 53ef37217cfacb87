"""How long another tenant waits for `GET /v1/jobs` while one tenant publishes a large model: first while its
body streams in, then while the file is checked; and while a model of deeply nested `If` subgraphs is checked.

    python benchmarks/api_under_upload.py                      # a 1 GiB model, a nested one of about 70 MiB
    python benchmarks/api_under_upload.py --model-mb 256 --nested-depth 0   # smaller, no nested model
    python benchmarks/api_under_upload.py --content-length     # bodies that say their length (not chunked)

The submit API runs as it does in production (uvicorn, its own process), on an embedded store in a temporary
folder, with no bus (publishing needs none). Tenant `nlp` has `--jobs` jobs queued and lists them (its first
page) one request after another, the whole time; tenant `vision` streams the model from a file written
beforehand (1 MiB chunks) and waits for the answer. Each listing's latency is put in the phase it began in:
`quiet` (before the upload), `upload` (body streaming), `check` (body sent, answer not yet in). Prints one JSON
object: per phase, the listings' count, p50, p99 and max in milliseconds; each publish's status, size and
seconds; and the API process's peak resident memory. Exits 1 when a publish was not answered 201, or a listing
failed.
"""

from __future__ import annotations

import argparse
import asyncio
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
sys.path.insert(0, str(ROOT))

TOKENS = "tok-vision=vision:ana,tok-nlp=nlp:bo"
UPLOADER = {"Authorization": "Bearer tok-vision", "Content-Type": "application/octet-stream"}
LISTER = {"Authorization": "Bearer tok-nlp"}
CHUNK = 1 << 20


# ---------------------------------------------------------------- the API, in a process of its own


async def serve(folder: Path, port: int, max_model_bytes: int) -> None:
    import uvicorn

    from services.submit.app import create_app
    from services.submit.context import SubmitContext, Uploads
    from shared.ledger import JobLedger
    from shared.logstore import open_log_store
    from shared.modelregistry import ModelRegistry
    from shared.modelstore import ModelStore
    from shared.onnxsig import CheckBounds
    from shared.store import open_store
    from shared.tokens import Tokens

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


def start_api(folder: Path, max_model_bytes: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(folder), str(port), str(max_model_bytes)], cwd=ROOT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the API exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("the API did not start within 60 s")


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


def publish(url: str, path: Path, name: str, lister: Lister, chunked: bool) -> dict:
    """Stream `path` as model `name` (`chunked`: without saying its length); the lister's phase follows the
    upload."""
    size = path.stat().st_size

    def body():
        with path.open("rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
        lister.phase = "check"  # (the last byte handed to the connection)

    lister.phase = "upload"
    started = time.perf_counter()
    response = httpx.post(
        f"{url}/v1/models",
        params={"name": name},
        content=body(),
        headers={**UPLOADER, **({} if chunked else {"Content-Length": str(size)})},
        timeout=3600,
    )
    seconds = time.perf_counter() - started
    lister.phase = "quiet"
    return {"name": name, "status": response.status_code, "bytes": size, "seconds": round(seconds, 2),
            "detail": response.json().get("detail") if response.status_code >= 400 else None}  # fmt: skip


def api_peak_rss(pid: int) -> float | None:
    """The API process's largest resident size so far, in MiB (Linux's VmHWM; None elsewhere)."""
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
    args = parser.parse_args()
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
        proc, url = start_api(api_folder, limit)
        try:
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
            lister.done.set()
            lister.join()
            peak = api_peak_rss(proc.pid)
        finally:
            proc.terminate()
            proc.wait(30)
    result = {
        "cpus": os.cpu_count(),
        "model_mb": args.model_mb,
        "chunked": not args.content_length,
        "jobs_listed": args.jobs,
        "quiet": summary(lister.samples.get("quiet", [])),
        "publishes": published,
        "listing_failures": lister.failures,
        "api_peak_rss_mb": peak,
    }
    print(json.dumps(result, indent=2))
    return 0 if lister.failures == 0 and all(p["status"] == 201 for p in published) else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        asyncio.run(serve(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    else:
        sys.exit(main())
