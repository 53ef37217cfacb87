"""Ray Serve serving an ONNX Runtime session on /v2/models/NAME/infer with v2 JSON in and out, for
benchmarks/serving.py. Run with Ray's own virtual environment:

    python benchmarks/serving_peers/rayserve_server.py --model mlp.onnx --name mlp --port 8000

A local Ray instance (no dashboard), Serve's HTTP proxy on PORT, one replica, no batching. The process stays
up until it is signalled; Ray's own processes end with it."""

from __future__ import annotations

import json
import signal
import threading

import ray
from common import ort_session, server_arguments, v2_inputs, v2_response
from ray import serve
from starlette.requests import Request
from starlette.responses import Response


@serve.deployment(num_replicas=1, max_ongoing_requests=64)
class OnnxDeployment:
    def __init__(self, model_path: str, model_name: str):
        self.session = ort_session(model_path)
        self.names = [output.name for output in self.session.get_outputs()]
        self.model_name = model_name

    async def __call__(self, request: Request) -> Response:
        feeds = v2_inputs(json.loads(await request.body()))
        outputs = dict(zip(self.names, self.session.run(self.names, feeds), strict=True))
        return Response(json.dumps(v2_response(self.model_name, outputs)), media_type="application/json")


if __name__ == "__main__":
    args = server_arguments(__doc__)
    ray.init(include_dashboard=False, log_to_driver=False, configure_logging=False)
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(
        OnnxDeployment.bind(args.model, args.name),
        name=args.name,
        route_prefix=f"/v2/models/{args.name}/infer",
    )
    print("ready", flush=True)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()
