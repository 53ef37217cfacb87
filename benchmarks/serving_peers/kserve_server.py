"""KServe's Python ModelServer serving an ONNX Runtime session through the v2 protocol (JSON and the binary
tensor extension) on /v2/models/NAME/infer, for benchmarks/serving.py. Run with KServe's own virtual
environment:

    python benchmarks/serving_peers/kserve_server.py --model mlp.onnx --name mlp --port 8000

One uvicorn worker, no gRPC; `predict` runs the session in the event loop's thread pool (as GPUYard does), and
answers binary when the request asks for it."""

from __future__ import annotations

import asyncio
import sys
import uuid

from common import ort_session, server_arguments


def onnx_model(name: str, model_path: str):
    """The session as a KServe `Model`, a class made here: kserve is imported only after the command line is
    read (it parses the command line when imported)."""
    from kserve import InferOutput, InferRequest, InferResponse, Model

    class OnnxModel(Model):
        def __init__(self, name: str, model_path: str):
            super().__init__(name)
            self.model_path = model_path
            self.load()

        def load(self) -> bool:
            self.session = ort_session(self.model_path)
            self.names = [output.name for output in self.session.get_outputs()]
            self.ready = True
            return self.ready

        async def predict(self, payload: InferRequest, headers=None, response_headers=None) -> InferResponse:
            feeds = {tensor.name: tensor.as_numpy() for tensor in payload.inputs}
            run = self.session.run
            results = await asyncio.get_running_loop().run_in_executor(None, run, self.names, feeds)
            outputs = []
            for name, array in zip(self.names, results, strict=True):
                output = InferOutput(name=name, shape=list(array.shape), datatype="FP32")
                output.set_data_from_numpy(array, binary_data=payload.use_binary_outputs)
                outputs.append(output)
            return InferResponse(
                response_id=payload.id or str(uuid.uuid4()),  # as KServe's own models do
                model_name=self.name,
                infer_outputs=outputs,
                use_binary_outputs=payload.use_binary_outputs,
            )

    return OnnxModel(name, model_path)


if __name__ == "__main__":
    ARGS = server_arguments(__doc__)
    sys.argv = sys.argv[:1]  # kserve parses the command line when imported: give it none of ours
    from kserve import ModelServer

    ModelServer(http_port=ARGS.port, workers=1, enable_grpc=False).start([onnx_model(ARGS.name, ARGS.model)])
