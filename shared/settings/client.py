"""The CLI client's settings: its server, token and context."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpuyard.shared.settings.common import ENV_PREFIX


class ClientSettings(BaseSettings):
    """The `gpuyard` CLI and `gpuyard.client.Client`; their --server and --token flags come first."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    server: str = Field(
        "",
        description="URL of the submit API, over the context's (default: the context's, else "
        "http://127.0.0.1:8080).",
    )
    token: str = Field("", description="Bearer token, over the context's (default: the context's).")
    publish_token: str = Field(
        "",
        description="Set by the executor in a job's environment, never by hand: the job's token for "
        "`gpuyard.publish_model` (`POST /v1/models` only; see docs/models.md).",
    )
    checkpoint_token: str = Field(
        "",
        description="Set by the executor in a job's environment, never by hand: the job's token for reporting its "
        "own checkpoints (`gpuyard.checkpoint`, `POST /v1/jobs/{id}/checkpoints` only; see docs/storage.md).",
    )
    context: str = Field(
        "",
        description="The context (a platform `gpuyard up` saved: `gpuyard context ls`) whose server and token "
        "commands use, as `--context`; default: the current one (`gpuyard context use`).",
    )
    config_dir: Path = Field(
        default_factory=lambda: Path.home() / ".config" / "gpuyard",
        description="Where `gpuyard up` saves each platform's context for the CLI (config.json): its server URL, "
        "admin token and data dir.",
    )
