"""LitServe serving an ONNX Runtime session on /v2/models/NAME/infer with v2 JSON in and out, for
benchmarks/serving.py. Run with LitServe's own virtual environment:

    python benchmarks/serving_peers/litserve_server.py --model mlp.onnx --name mlp --port 8000

One API server process and one inference worker (LitServe's layout: the HTTP process hands each request to
the worker over a queue), no batching, no client file."""

from __future__ import annotations

import litserve as ls
import numpy as np
from common import ort_session, server_arguments, v2_inputs, v2_response


class OnnxApi(ls.LitAPI):
    def __init__(self, model_path: str, model_name: str):
        super().__init__(api_path=f"/v2/models/{model_name}/infer")
        self.model_path = model_path  # the worker process gets the object pickled: no globals
        self.model_name = model_name

    def setup(self, device):
        self.session = ort_session(self.model_path)
        self.names = [output.name for output in self.session.get_outputs()]

    def decode_request(self, request: dict) -> dict[str, np.ndarray]:
        return v2_inputs(request)

    def predict(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(self.names, self.session.run(self.names, feeds), strict=True))

    def encode_response(self, outputs: dict[str, np.ndarray]) -> dict:
        return v2_response(self.model_name, outputs)


if __name__ == "__main__":
    args = server_arguments(__doc__)
    server = ls.LitServer(OnnxApi(args.model, args.name), accelerator="cpu", workers_per_device=1, timeout=60)
    server.run(
        host="127.0.0.1", port=args.port, num_api_servers=1, log_level="warning", generate_client_file=False
    )
