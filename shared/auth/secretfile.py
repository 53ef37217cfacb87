"""A secret kept in a file of its own: the key that signs jobs' publish tokens (`gpuyard.shared.auth.jobtokens`), the one
that signs dashboard sessions (`shared/auth/sessions.py`), the key of tenants' uids (`shared/runtime/jobusers.py`)
and the scrape token of the monitor's and the serving entry point's /metrics (`ScrapeAuth`). Mode 0600, at least
32 bytes; a Kubernetes Secret mounted as a volume is accepted as it is mounted."""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import logging
import os
import secrets
import stat
from pathlib import Path

from gpuyard.shared.auth.bearer import bearer_token
from gpuyard.shared.runtime.paths import write_private

log = logging.getLogger(__name__)

MIN_SECRET_BYTES = 32


class SecretFileError(ValueError):
    """A secret file that cannot be used; the message names the file and why, never its content."""


def read_secret(path: Path, what: str) -> bytes:
    """The secret in `path` (`what` names it in errors: 'publish secret')."""
    try:
        mode = path.stat().st_mode
        raw = path.read_bytes().strip()
    except FileNotFoundError:
        raise SecretFileError(f"{what} file {path} does not exist") from None
    except OSError as exc:
        raise SecretFileError(f"{what} file {path} cannot be read: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO) and not _mounted_secret(path):
        raise SecretFileError(
            f"{what} file {path} is open to other users (mode {stat.S_IMODE(mode):o}): chmod 600 it"
        )
    if len(raw) < MIN_SECRET_BYTES:
        raise SecretFileError(f"{what} file {path} holds under {MIN_SECRET_BYTES} bytes")
    return raw


def _mounted_secret(path: Path) -> bool:
    """A Kubernetes Secret mounted as a volume: its files are links into a `..data` folder, readable by the
    pod's group (defaultMode): the mount itself keeps them from others."""
    return any(part.startswith("..") for part in path.resolve().parts)


def ensure_secret(path: Path, what: str) -> bytes:
    """The secret in `path`, made (random, mode 0600 from its first byte) when there is none. Two processes
    making it at once agree on one: the second's file is linked in only where none is yet."""
    if not path.exists():
        draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}.new")  # (PID 1 in two containers)
        write_private(draft, secrets.token_urlsafe(48) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                draft.unlink()
    return read_secret(path, what)


# ---------------------------------------------------------------- the scrape token of /metrics

METRICS_TOKEN_FILE = "secrets/metrics.token"
"""In the data dir: the default scrape token (`metrics_token_file` names another)."""
METRICS_TOKEN_WHAT = "metrics token"
CHALLENGE = 'Bearer realm="metrics"'
"""The `WWW-Authenticate` of a refused scrape."""
REFUSED = (
    "this /metrics needs its scrape token (metrics_token_file): 'Authorization: Bearer <token>', or basic auth "
    "with the token as the password"
)


class ScrapeAuth:
    """Who may read a /metrics that names tenants, jobs and users (the monitor's, the serving entry point's):
    a scrape that carries the token, as Prometheus's `authorization` (`Authorization: Bearer <token>`) or as
    the password of its `basic_auth` (any user name). The token is the file's, read again when the file
    changes (a new token takes effect at the next scrape); `None` as the path: every scrape is answered
    (`metrics_auth=off`, for an address that jobs cannot reach)."""

    def __init__(self, path: Path | None):
        self.path = path
        self._seen: tuple[int, int] | None = None
        self._token = b""

    @classmethod
    def from_settings(cls, settings) -> ScrapeAuth:
        """From a service's `metrics_auth` and `metrics_token_file` (default `<data dir>/secrets/metrics.token`,
        made, random and 0600, when there is none). A token that cannot be used is logged, and every scrape
        refused until it can."""
        if settings.metrics_auth == "off":
            return cls(None)
        path = Path(settings.metrics_token_file or Path(settings.data_dir) / METRICS_TOKEN_FILE)
        try:
            ensure_secret(path, METRICS_TOKEN_WHAT)
        except (SecretFileError, OSError) as exc:
            log.error("every scrape of /metrics is refused: %s", exc)
        return cls(path)

    @property
    def open(self) -> bool:
        return self.path is None

    def token(self) -> bytes:
        """The token, read again when its file changed; b'' (nothing matches it) when it cannot be read (or
        when scrapes are open, with no token file)."""
        path = self.path
        if path is None:
            return b""
        try:
            found = path.stat()
        except OSError:
            return b""
        seen = (found.st_mtime_ns, found.st_ino)
        if seen != self._seen:
            try:
                self._token = read_secret(path, METRICS_TOKEN_WHAT)
            except SecretFileError as exc:
                log.error("every scrape of /metrics is refused: %s", exc)
                self._token = b""
            self._seen = seen
        return self._token

    def allows(self, authorization: str | None) -> bool:
        """Whether a request with this `Authorization` header may read /metrics."""
        if self.path is None:
            return True
        given = presented(authorization)
        token = self.token()
        return given is not None and bool(token) and hmac.compare_digest(given, token)


def presented(authorization: str | None) -> bytes | None:
    """The token an `Authorization` header presents: a bearer token, or a basic auth's password."""
    if authorization is None:
        return None
    token = bearer_token(authorization)
    if token is not None:
        return token.encode()
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        _user, sep, password = base64.b64decode(rest.strip(), validate=True).partition(b":")
    except (binascii.Error, ValueError):
        return None
    return password if sep else None
