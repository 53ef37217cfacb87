"""Dashboard sessions: what a browser holds once it logged in with a token.

The session cookie is `gys1.<token id>.<expires>.<nonce>.<signature>`: the id of the token it logged in with
(never the token), when the session ends (Unix seconds), a random nonce, and an HMAC-SHA256 of the rest under
the session secret (a file of the data dir, mode 0600, shared by every submit instance). A request with it
stands for that token's tenant and user as long as the token itself is valid: revoking or expiring the token
ends its sessions at the next request. The submit service issues sessions; any service that reads the same
key and tokens (the serving entry point) can accept them.

CSRF: every request that changes something and comes with the cookie (not with a bearer token) must carry the
session's CSRF token, an HMAC of its nonce, in the `X-CSRF-Token` header or a form's `csrf` field; the pages
get it in a `<meta>` element. The cookie is also SameSite=Lax, and such requests from another origin (their
`Origin` header) are refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from shared.jobtokens import SECRETS_DIR
from shared.secretfile import SecretFileError, ensure_secret

log = logging.getLogger(__name__)

COOKIE = "gpuyard_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"
PREFIX = "gys1"
SECRET_FILE = "session.key"
"""The key's default file, under the data dir's secrets/ (`session_secret_file` names another)."""
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_TOKEN_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class SessionRefused(Exception):
    """A cookie that stands for no session; the message says why (for the login page)."""


@dataclass(frozen=True)
class Session:
    token_id: str
    expires: int
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _mac(secret: bytes, text: str) -> str:
    return _b64(hmac.new(secret, text.encode(), hashlib.sha256).digest())


def issue(secret: bytes, token_id: str, lifetime: float, now: float | None = None) -> tuple[str, Session]:
    """A new session for the token `token_id`: (the cookie's value, the session)."""
    if not _TOKEN_ID.match(token_id):
        raise ValueError(f"token id {token_id!r} cannot be carried by a session")
    session = Session(token_id, int((time.time() if now is None else now) + lifetime), secrets.token_hex(16))
    signed = f"{PREFIX}.{session.token_id}.{session.expires}.{session.nonce}"
    return f"{signed}.{_mac(secret, signed)}", session


def read(secret: bytes, cookie: str, now: float | None = None) -> Session:
    """The session of a cookie this platform signed and that has not expired; SessionRefused otherwise."""
    signed, dot, signature = cookie.rpartition(".")
    parts = signed.split(".")
    if not dot or len(parts) != 4 or parts[0] != PREFIX:
        raise SessionRefused("not a session")
    if not hmac.compare_digest(signature, _mac(secret, signed)):
        raise SessionRefused("a session signed by another key (the platform's key changed): log in again")
    _, token_id, expires, nonce = parts
    if not expires.isdigit() or not _TOKEN_ID.match(token_id):
        raise SessionRefused("not a session")
    if (time.time() if now is None else now) >= int(expires):
        raise SessionRefused("your session expired: log in again")
    return Session(token_id, int(expires), nonce)


def csrf_token(secret: bytes, session: Session) -> str:
    return _mac(secret, f"csrf.{session.nonce}")


def csrf_ok(secret: bytes, session: Session, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(given, csrf_token(secret, session))


def same_origin(origin: str | None, host: str | None) -> bool:
    """Whether a request's `Origin` header (absent: a same-origin navigation or a non-browser) names the
    host it was sent to."""
    if origin is None:
        return True
    if host is None or origin == "null":
        return False
    return origin.split("://", 1)[-1].rstrip("/") == host


def load_key(data_dir: Path, setting: Path | None, *, without_it: str) -> bytes | None:
    """The sessions' key, made (mode 0600) when there is none: every service that reads the same data dir
    agrees on one. None when it cannot be read or made, logged with `without_it` (what the service then
    refuses)."""
    path = setting or Path(data_dir) / SECRETS_DIR / SECRET_FILE
    try:
        return ensure_secret(path, "session secret")
    except (OSError, SecretFileError) as exc:
        log.error("%s: %s", without_it, exc)
        return None
