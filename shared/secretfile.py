"""A secret kept in a file of its own: the key that signs jobs' publish tokens (`shared.jobtokens`) and the one
that signs dashboard sessions (`shared/sessions.py`). Mode 0600, at least 32 bytes; a Kubernetes
Secret mounted as a volume is accepted as it is mounted."""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from shared.paths import write_private

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
        draft = path.with_name(f".{path.name}.{os.getpid()}.new")
        write_private(draft, secrets.token_urlsafe(48) + "\n")
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            with contextlib.suppress(FileNotFoundError):
                draft.unlink()
    return read_secret(path, what)
