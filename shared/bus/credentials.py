"""A bus user's credentials: one small JSON file per user, `{"user": ..., "password": ...}`, mode 0600.

`gpuyard up` makes one per role (`gpuyard.shared.bus.permissions.Role`) in `<data dir>/bus/` (mode 0700), once, and
reuses them on the next start; each service reads its own through the `nats_credentials` setting, so the
password never appears in a command line or an environment. Jobs are given none of them.
"""

from __future__ import annotations

import json
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from gpuyard.shared.runtime.paths import write_private

BUS_DIR = "bus"


class CredentialsError(ValueError):
    """A credentials file that is missing, unreadable, malformed or readable by others."""


@dataclass(frozen=True)
class BusCredentials:
    user: str
    password: str

    def __repr__(self) -> str:  # never print the password
        return f"BusCredentials(user={self.user!r}, password=***)"


def inbox_prefix(user: str) -> str:
    """Where replies to a user's requests come: its own part of the inbox namespace, `_INBOX.<user>`."""
    return f"_INBOX.{user}"


def bus_dir(data_dir: Path) -> Path:
    return Path(data_dir) / BUS_DIR


def credentials_path(data_dir: Path, user: str) -> Path:
    return bus_dir(data_dir) / f"{user}.json"


def read_credentials(path: Path) -> BusCredentials:
    """The credentials in `path`; CredentialsError (one line naming the file) when they cannot be used."""
    try:
        mode = path.stat().st_mode
        text = path.read_text()
    except FileNotFoundError:
        raise CredentialsError(f"NATS credentials file {path} does not exist") from None
    except OSError as exc:
        raise CredentialsError(f"NATS credentials file {path} cannot be read: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsError(
            f"NATS credentials file {path} is open to other users (mode {stat.S_IMODE(mode):o}): chmod 600 it"
        )
    try:
        doc = json.loads(text)
    except ValueError:
        raise CredentialsError(f"NATS credentials file {path} is not JSON") from None
    user = doc.get("user") if isinstance(doc, dict) else None
    password = doc.get("password") if isinstance(doc, dict) else None
    if not (isinstance(user, str) and user and isinstance(password, str) and password):
        raise CredentialsError(
            f'NATS credentials file {path} must hold {{"user": "...", "password": "..."}} (two non-empty strings)'
        )
    return BusCredentials(user, password)


def write_credentials(path: Path, credentials: BusCredentials) -> None:
    """Write `path` with mode 0600 from its first byte (a temporary file renamed over it)."""
    write_private(path, json.dumps({"user": credentials.user, "password": credentials.password}) + "\n")


def ensure_credentials(data_dir: Path, users: list[str]) -> dict[str, BusCredentials]:
    """Each user's credentials: read from the data dir, or made (a random password) and written there."""
    found = {}
    for user in users:
        path = credentials_path(data_dir, user)
        if path.exists():
            found[user] = read_credentials(path)
            continue
        found[user] = BusCredentials(user, secrets.token_urlsafe(32))
        write_credentials(path, found[user])
    bus_dir(data_dir).chmod(0o700)
    return found
