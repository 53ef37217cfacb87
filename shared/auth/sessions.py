"""Dashboard sessions: what a browser holds once it logged in with a token.

The session cookie is `gys1.<token id>.<expires>.<nonce>.<signature>`: the id of the token it logged in with
(never the token), when the session ends (Unix seconds), a random nonce, and an HMAC-SHA256 of the rest under
the session secret (a file of the data dir, mode 0600, shared by every submit instance). A request with it
stands for that token's tenant and user as long as the token itself is valid: revoking or expiring the token
ends its sessions at the next request. The submit service issues sessions; any service that reads the same
key and tokens (the serving entry point) can accept them.

Logging out ends a session on the server too (`end`): its cookie, and the CSRF token that goes with it, are
refused from then on even where a copy of them was kept. The sessions so ended are recorded, each until its
own expiry, in a file of the data dir (`ENDED_FILE`, mode 0600, re-read when it changes: a stat per lookup, as
the tokens file), which every service that reads the key through `load_key` with that data dir shares.

CSRF: every request that changes something and comes with the cookie (not with a bearer token) must carry the
session's CSRF token, an HMAC of its nonce, in the `X-CSRF-Token` header or a form's `csrf` field; the pages
get it in a `<meta>` element. The cookie is also SameSite=Lax, and such requests from another origin (their
`Origin` header) are refused.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

from gpuyard.shared.auth.jobtokens import SECRETS_DIR
from gpuyard.shared.auth.secretfile import SecretFileError, ensure_secret
from gpuyard.shared.runtime.paths import PRIVATE_FILE, private_dir

log = logging.getLogger(__name__)

COOKIE = "gpuyard_session"
CSRF_HEADER = "x-csrf-token"
CSRF_FIELD = "csrf"
PREFIX = "gys1"
SECRET_FILE = "session.key"
"""The key's default file, under the data dir's secrets/ (`session_secret_file` names another)."""
ENDED_FILE = "sessions-ended.json"
"""The record of the sessions ended by logging out, under the data dir's secrets/ (beside the key's default
file): `{"ended": {"<nonce>": <the session's expiry, Unix seconds>}}`."""
LOGGED_OUT = "this session was logged out: log in again"
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
    session = Session(token_id, int(expires), nonce)
    if ended_sessions(secret).ended(session):
        raise SessionRefused(LOGGED_OUT)
    return session


def end(secret: bytes, session: Session, now: float | None = None) -> bool:
    """End `session` on the server (logging out): its cookie and CSRF token are refused from now on, by every
    service that shares `secret`'s record. False (logged) where the record cannot be written."""
    return ended_sessions(secret).end(session, now)


def csrf_token(secret: bytes, session: Session) -> str:
    return _mac(secret, f"csrf.{session.nonce}")


def csrf_ok(secret: bytes, session: Session, given: str | None) -> bool:
    """Whether `given` is the CSRF token of `session`, a session not ended."""
    if given is None or not hmac.compare_digest(given, csrf_token(secret, session)):
        return False
    try:
        return not ended_sessions(secret).ended(session)
    except SessionRefused:
        return False


class EndedSessions:
    """The sessions ended before their expiry, each kept until it (then its cookie is refused as expired, and
    it is forgotten at the next write): in a file (`path`), re-read when it changes, or in memory (no path).
    A file that cannot be read refuses every session until it is fixed or removed, as the tokens file refuses
    its tokens: a logout is never forgotten."""

    def __init__(self, path: Path | None):
        self.path = path
        self._seen: tuple[int, int, int] | None = None
        self._ended: dict[str, int] = {}
        self._broken = ""

    def ended(self, session: Session) -> bool:
        """Whether `session` was ended; SessionRefused when the record cannot be read."""
        return session.nonce in self._current()

    def _current(self) -> dict[str, int]:
        if self.path is None:
            return self._ended
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                self._ended, self._seen, self._broken = _read_ended(self.path), seen, ""
        except FileNotFoundError:
            self._ended, self._seen, self._broken = {}, None, ""
        except (OSError, ValueError) as exc:
            if not self._broken:
                log.error("the record of ended sessions is unusable, every session is refused: %s", exc)
            self._seen, self._broken = None, str(exc)
        if self._broken:
            raise SessionRefused(f"the record of logged-out sessions cannot be read ({self._broken})")
        return self._ended

    def end(self, session: Session, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        if self.path is None:
            self._ended = {n: e for n, e in self._ended.items() if e > now} | {session.nonce: session.expires}
            return True
        try:
            private_dir(self.path.parent)
            lock_fd = os.open(
                self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, PRIVATE_FILE
            )
            try:
                fcntl.flock(lock_fd, fcntl.LOCK_EX)
                ended = _read_ended(self.path) if self.path.exists() else {}
                ended = {n: e for n, e in ended.items() if e > now} | {session.nonce: session.expires}
                _write_ended(self.path, ended)
            finally:
                os.close(lock_fd)
        except (OSError, ValueError) as exc:
            log.error(
                "cannot record a logout in %s, its session stays valid until it expires: %s", self.path, exc
            )
            return False
        return True


def _read_ended(path: Path) -> dict[str, int]:
    """Raises OSError, or ValueError for a file that is not such a record."""
    doc = json.loads(path.read_text())
    ended = doc.get("ended") if isinstance(doc, dict) else None
    if not isinstance(ended, dict) or not all(isinstance(e, int) for e in ended.values()):
        raise ValueError(f"{path} is not a record of ended sessions")
    return {str(n): e for n, e in ended.items()}


def _write_ended(path: Path, ended: dict[str, int]) -> None:
    """Atomically (a 0600 temporary file renamed over it), each write's mtime later than the last one's to the
    nanosecond, so that a reader's (inode, mtime, size) check sees every change (as `gpuyard.shared.auth.tokens`)."""
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"ended": ended}))
    with contextlib.suppress(FileNotFoundError):
        mtime = max(time.time_ns(), os.stat(path).st_mtime_ns + 1)
        os.utime(tmp, ns=(mtime, mtime))
    tmp.replace(path)


_RECORDS: dict[bytes, EndedSessions] = {}


def ended_sessions(secret: bytes) -> EndedSessions:
    """The record of the sessions of `secret` ended by logging out: the data dir's file for a key that
    `load_key` read; in memory for a key given otherwise (one process: tests, an embedded service)."""
    record = _RECORDS.get(secret)
    if record is None:
        record = _RECORDS[bytes(secret)] = EndedSessions(None)
    return record


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
    agrees on one, and on the record of the sessions ended by logging out (`ENDED_FILE` of the data dir). None
    when it cannot be read or made, logged with `without_it` (what the service then refuses)."""
    path = setting or Path(data_dir) / SECRETS_DIR / SECRET_FILE
    try:
        key = ensure_secret(path, "session secret")
    except (OSError, SecretFileError) as exc:
        log.error("%s: %s", without_it, exc)
        return None
    _RECORDS[key] = EndedSessions(Path(data_dir) / SECRETS_DIR / ENDED_FILE)
    return key
