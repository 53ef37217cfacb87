"""A dev environment's notebook token and port (docs/dev.md), which the executor gives its replica
(JUPYTER_TOKEN, GPUYARD_DEV_PORT) and the submit service's proxy derives again to reach it, so that neither is
ever stored, sent in the API or put on a command line: both come from the job's id and attempt and the secret
that the submit service and the executors already share for jobs' tokens (`gpuyard.shared.auth.jobtokens`).

The port is one of PORT_SPAN ports from PORT_BASE, the same on both sides; JupyterLab listens on loopback only
(`--ip=127.0.0.1`), and the node's gateway forwards to a port only where one of the replica's own processes
listens, so another process that holds it first makes the environment fail to start (it never reaches
another's server)."""

from __future__ import annotations

import hashlib
import hmac

PORT_BASE = 20_000
PORT_SPAN = 12_000
"""Ports 20000 to 31999: under Linux's default ephemeral range (32768 up), where outgoing connections take
theirs."""


def _mac(secret: bytes, what: str, job_id: str, attempt: int) -> bytes:
    return hmac.new(secret, f"gpuyard-dev/{what}/{job_id}/{attempt}".encode(), hashlib.sha256).digest()


def dev_token(secret: bytes, job_id: str, attempt: int) -> str:
    """The notebook server's token for the job's attempt: 64 hex digits."""
    return _mac(secret, "token", job_id, attempt).hex()


def dev_port(secret: bytes, job_id: str, attempt: int) -> int:
    """The loopback port the attempt's notebook server listens on."""
    return PORT_BASE + int.from_bytes(_mac(secret, "port", job_id, attempt)[:4], "big") % PORT_SPAN


def dev_env(secret: bytes, job_id: str, attempt: int) -> dict[str, str]:
    """What a dev environment's replica gets in its environment: its token and its port."""
    return {
        "JUPYTER_TOKEN": dev_token(secret, job_id, attempt),
        "GPUYARD_DEV_PORT": str(dev_port(secret, job_id, attempt)),
    }
