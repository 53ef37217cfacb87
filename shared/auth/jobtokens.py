"""A job's tokens: what lets code inside a job publish a model, or report its own checkpoints, and nothing else.

Each token has one scope. The executor puts one of each into each replica's environment
(services/executor/jobenv.py): `GPUYARD_PUBLISH_TOKEN` (`models:publish`), which `gpuyard.publish_model` sends
as its bearer token and the submit service accepts on `POST /v1/models` only, for the job's tenant, recording the
job as the model's producer; and `GPUYARD_CHECKPOINT_TOKEN` (`jobs:checkpoint`), which `gpuyard.checkpoint` sends
and the submit service accepts on `POST /v1/jobs/{id}/checkpoints` only, for that one job. They are never typed
by anyone, and they are not the platform's credentials: they are signed with a secret the submit service and the
executors share (a file of the data dir that `gpuyard up` makes, mode 0600, or `GPUYARD_PUBLISH_SECRET_FILE`).

Format: `gyjob1.<payload>.<signature>`, the payload base64url JSON
`{"t": tenant, "j": job id, "a": attempt, "s": scope, "e": expiry (Unix seconds)}` and the
signature base64url HMAC-SHA256 of `gyjob1.<payload>` under the secret. The submit service also checks that
the attempt is the job's current one and that it is still placed or running: a token outlives its job
by nothing.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from pathlib import Path

from gpuyard.shared.auth import secretfile

PREFIX = "gyjob1."
PUBLISH_SCOPE = "models:publish"
"""A job's publish token: `POST /v1/models`, for the job's tenant."""
CHECKPOINT_SCOPE = "jobs:checkpoint"
"""A job's checkpoint token: `POST /v1/jobs/{id}/checkpoints`, for that job alone."""
SECRETS_DIR = "secrets"
SECRET_FILE = "publish.key"
WHAT = "publish secret"


class JobTokenError(ValueError):
    """A job token that cannot be used; the message says why (never the token or the secret)."""


@dataclass(frozen=True)
class JobClaims:
    tenant: str
    job_id: str
    attempt: int
    scope: str
    expires: float


def is_job_token(token: str) -> bool:
    return token.startswith(PREFIX)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, signed: str) -> bytes:
    return hmac.new(secret, signed.encode(), hashlib.sha256).digest()


def sign(
    secret: bytes,
    *,
    tenant: str,
    job_id: str,
    attempt: int,
    lifetime: float,
    scope: str = PUBLISH_SCOPE,
    now: float | None = None,
) -> str:
    expires = int((time.time() if now is None else now) + lifetime)
    payload = json.dumps(
        {"t": tenant, "j": job_id, "a": attempt, "s": scope, "e": expires}, separators=(",", ":")
    )
    signed = PREFIX + _b64(payload.encode())
    return f"{signed}.{_b64(_mac(secret, signed))}"


def verify(secret: bytes, token: str, *, scope: str = PUBLISH_SCOPE, now: float | None = None) -> JobClaims:
    """The claims of a token signed with `secret`, of `scope` and not expired; JobTokenError otherwise."""
    if not is_job_token(token):
        raise JobTokenError("not a job token")
    signed, dot, signature = token.rpartition(".")
    if not dot or signed.count(".") != 1:
        raise JobTokenError("malformed job token")
    try:
        given = _unb64(signature)
    except (binascii.Error, ValueError):
        raise JobTokenError("malformed job token") from None
    if not hmac.compare_digest(given, _mac(secret, signed)):
        raise JobTokenError("job token with a bad signature (another platform's, or altered)")
    try:
        doc = json.loads(_unb64(signed.removeprefix(PREFIX)))
        claims = JobClaims(
            tenant=str(doc["t"]), job_id=str(doc["j"]), attempt=int(doc["a"]), scope=str(doc["s"]),
            expires=float(doc["e"]),
        )  # fmt: skip
    except (ValueError, KeyError, TypeError, binascii.Error):
        raise JobTokenError("malformed job token") from None
    if claims.scope != scope:
        raise JobTokenError(f"a job token for {claims.scope!r}, not {scope!r}")
    if (time.time() if now is None else now) >= claims.expires:
        raise JobTokenError("job token expired")
    return claims


# ---------------------------------------------------------------- the shared secret


def secret_path(data_dir: Path | str, setting: Path | None = None) -> Path:
    """The secret's file: the setting (`GPUYARD_PUBLISH_SECRET_FILE`), else `<data dir>/secrets/publish.key`."""
    return Path(setting) if setting else Path(data_dir) / SECRETS_DIR / SECRET_FILE


def read_secret(path: Path) -> bytes:
    """The secret in `path`; JobTokenError (naming the file, never its content) when it cannot be used."""
    try:
        return secretfile.read_secret(path, WHAT)
    except secretfile.SecretFileError as exc:
        raise JobTokenError(str(exc)) from None


def ensure_secret(path: Path) -> bytes:
    """The secret in `path`, made (random, mode 0600 from its first byte) when there is none."""
    try:
        return secretfile.ensure_secret(path, WHAT)
    except secretfile.SecretFileError as exc:
        raise JobTokenError(str(exc)) from None
