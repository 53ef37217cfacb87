"""`gpuyard.publish_model`: publish an ONNX file as a model version, from a training job or anywhere else.

    import gpuyard

    torch.onnx.export(model, example, "model.onnx")
    gpuyard.publish_model("model.onnx", name="mnist")   # -> version 1, 2, 3…
    gpuyard.publish_model("model.onnx", name="mnist", serve={"gpus": 0.25, "replicas": 2})  # and deploy it

Inside a job it authenticates with the job's publish token (GPUYARD_PUBLISH_TOKEN, which the executor puts
in each replica's environment with the API's URL, GPUYARD_SERVER): nothing to type, and nothing that could
do more than publish for the job's tenant. Elsewhere it uses the CLI's server and token (--server/--token
flags' settings: GPUYARD_SERVER, GPUYARD_TOKEN, or what `gpuyard up` saved). See docs/models.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuyard.client import Client, ClientError
from gpuyard.shared.contracts.api.models import ModelPublishedOut
from gpuyard.shared.settings.client import ClientSettings


def publish_model(
    path: str | Path,
    name: str,
    version: int | None = None,
    public: bool = False,
    serve: dict[str, Any] | None = None,
    *,
    server: str | None = None,
    token: str | None = None,
) -> ModelPublishedOut:
    """Publish the ONNX file at `path` as model `name` (its next version, or `version`); `public`: every
    tenant may see and use it; `serve`: deploy the version published too, with a deployment's fields (gpus,
    replicas, priority, cpus, memory; {} for the defaults: one replica on the CPU). Returns the published
    version (with `duplicate` true when these bytes were published before, and `deployment`: its serve jobs).
    Raises ClientError with one line saying why it was refused."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror or exc}") from None
    job_token = ClientSettings().publish_token
    client = Client(server, token or job_token or None)
    try:
        return client.publish_model(data, name=name, version=version, public=public, serve=serve)
    finally:
        client.http.close()
