"""GPUYARD's client package: the `gpuyard` CLI, `gpuyard.client.Client`, and helpers for training code.

`gpuyard.publish_model(path, name=...)` publishes an ONNX file as a model version (docs/models.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuyard.publishing import publish_model as publish_model


def __getattr__(name: str) -> Any:  # imported when used: `import gpuyard` stays light
    if name == "publish_model":
        from gpuyard.publishing import publish_model

        return publish_model
    raise AttributeError(f"module 'gpuyard' has no attribute {name!r}")
