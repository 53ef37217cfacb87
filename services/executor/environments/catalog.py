"""What a node holds of built environments (`<root>/<key>/` with its META), and their removal: renamed out of
the way first (a job that starts meanwhile builds it anew, never finds half of it), then deleted."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpuyard.services.executor.environments.builder import META, USED

REMOVING = ".removing-"


@dataclass(frozen=True)
class HeldEnvironment:
    key: str
    python: str
    pip: list[str]
    size_bytes: int
    last_used: datetime
    built_at: datetime


def held_environments(root: Path) -> list[HeldEnvironment]:
    """Every finished environment under `root`, the most recently used first."""
    found = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.name.startswith(".") or not entry.is_dir(follow_symlinks=False):
                continue
            held = read_environment(Path(entry.path))
            if held is not None:
                found.append(held)
    return sorted(found, key=lambda e: e.last_used, reverse=True)


def read_environment(folder: Path) -> HeldEnvironment | None:
    try:
        meta = json.loads((folder / META).read_text())
        used = (
            os.stat(folder / USED).st_mtime if (folder / USED).exists() else os.stat(folder / META).st_mtime
        )
        return HeldEnvironment(
            key=str(meta["key"]),
            python=str(meta["python"]),
            pip=[str(p) for p in meta.get("pip", [])],
            size_bytes=int(meta.get("size_bytes", 0)),
            last_used=datetime.fromtimestamp(used, UTC),
            built_at=datetime.fromisoformat(meta["built_at"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


def set_aside(root: Path, key: str) -> tuple[Path, int] | None:
    """Rename an environment out of the way (a job that starts afterwards builds it anew, never finds half of
    it): where it went and the bytes it holds; None when the node holds none of that key."""
    folder = root / key
    held = read_environment(folder)
    if held is None or key.startswith("."):
        return None
    gone = root / f"{REMOVING}{key}-{secrets.token_hex(4)}"
    try:
        os.rename(folder, gone)
    except FileNotFoundError:
        return None
    return gone, held.size_bytes


def put_back(root: Path, key: str, gone: Path) -> None:
    """Undo `set_aside` (a job started in it meanwhile)."""
    os.rename(gone, root / key)


def delete_set_aside(gone: Path) -> None:
    shutil.rmtree(gone, ignore_errors=True)


def clear_leftovers(root: Path) -> None:
    """What an executor that died left: removals half done (builds half done are cleared by the next build of
    their key, under its lock)."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(root):
            if entry.name.startswith(REMOVING):
                shutil.rmtree(entry.path, ignore_errors=True)


def unused_since(held: list[HeldEnvironment], before: datetime, in_use: set[str]) -> list[HeldEnvironment]:
    """The environments no job has used since `before` and none uses now: what the retention sweep removes."""
    return [e for e in held if e.last_used < before and e.key not in in_use]
