"""The executor gateway: the documented, token-checked path from the submit service into a node's running
replicas (exec, shell, ports: docs/access.md). The executor that announces its node serves it; the submit
service reaches it at the URL the node's heartbeat names (`NodeHeartbeat.gateway`), with the gateway token.
Variables: GPUYARD_GATEWAY_HOST, GPUYARD_GATEWAY_PORT, GPUYARD_GATEWAY_URL, GPUYARD_GATEWAY_TOKEN_FILE."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gpuyard.shared.settings.common import CommonSettings

GATEWAY_TOKEN_FILE = "secrets/gateway.token"
"""In the data dir: the default gateway token (`gateway_token_file` names another)."""
GATEWAY_TOKEN_WHAT = "gateway token"


class GatewaySettings(CommonSettings):
    gateway_host: str = Field(
        "127.0.0.1",
        description="Where the executor's gateway listens (exec, shell and ports into running jobs, for the "
        "submit service only: every request carries the gateway token). 127.0.0.1 serves a submit service on "
        "the same machine; a node of a cluster listens on an address the submit service reaches.",
    )
    gateway_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="The gateway's port; 0 picks a free one, announced in the node's heartbeat.",
    )
    gateway_url: str = Field(
        "",
        description="The gateway's URL as the submit service reaches it, announced in the node's heartbeat; "
        "default: http://<gateway_host>:<its port> (the node's address when the host is 0.0.0.0 or ::).",
    )
    gateway_token_file: Path | None = Field(
        None,
        description="The gateway token (mode 0600) that the submit service sends and the executor's gateway "
        "checks; default `<data dir>/secrets/gateway.token`, made at start. On Kubernetes, a Secret mounted "
        "in both (deploy/).",
    )

    @property
    def gateway_token_path(self) -> Path:
        return Path(self.gateway_token_file or Path(self.data_dir) / GATEWAY_TOKEN_FILE)


def gateway_settings_of(settings: CommonSettings) -> GatewaySettings:
    """A service's gateway settings: its own when its settings include them, else read from the environment
    (GPUYARD_GATEWAY_*) with its data dir."""
    if isinstance(settings, GatewaySettings):
        return settings
    return GatewaySettings(data_dir=settings.data_dir)
