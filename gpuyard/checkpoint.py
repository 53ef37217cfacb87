"""`gpuyard.checkpoint`: save a job's checkpoints where its next attempt finds them, and resume from the latest.

    from gpuyard import checkpoint

    found = checkpoint.load_latest()              # None on a job's first attempt
    start = found[0] + 1 if found else 0
    if found:
        model.load_state_dict(found[1]["model"])
        optimizer.load_state_dict(found[1]["optimizer"])
    for step in range(start, steps):
        train_one_step()
        if step % 100 == 0:
            checkpoint.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, step)

Inside a job the checkpoints go to its checkpoint folder (GPUYARD_CHECKPOINT_DIR), which every attempt of the job
finds again after a preemption, a retry or a requeue; elsewhere, or to use another folder, pass `directory=`. A
checkpoint is a PyTorch object (a state dict, saved with `torch.save`), bytes, or the path of a file or folder
to copy. Each one is written atomically (a temporary name in the same folder, flushed to disk, renamed, the
folder flushed): a job killed in the middle of a save leaves the previous checkpoints whole, and the next save
removes what it left. The last `keep` checkpoints are kept (the one just saved always among them). One process of a job saves (rank 0, say); every one
may load.

Inside a job, each save is reported to the platform (`job.checkpointed`: its step, time and size, which
`gpuyard describe` shows), with the job's own checkpoint token (GPUYARD_CHECKPOINT_TOKEN, which can do nothing
else). A report that cannot be sent never fails the save: it is logged once. See docs/storage.md.

PyTorch is imported only when a PyTorch object is saved or loaded: bytes and files need no more than the
client."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import shutil
import socket
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DIR_VARIABLE = "GPUYARD_CHECKPOINT_DIR"
"""The job's checkpoint folder, which the executor gives each replica (the same for every attempt)."""
TORCH, RAW, COPY = "pt", "bin", "d"
"""A checkpoint's kinds, the suffix of its name: a PyTorch object, bytes, a copy of a file or folder."""
NAME = re.compile(r"step-(\d{20})\.(pt|bin|d)")
"""A checkpoint's name: `step-<step, 20 digits>.<kind>` (sorted by name, by step)."""
TEMPORARY = ".tmp-"
"""The prefix of what a save writes before its rename: `.tmp-<host>@<pid>~<random>~<name>` (`_temporary`)."""
STALE_SECONDS = 86400.0
"""A temporary entry older than this is removed whoever wrote it (another machine's, a reused pid's)."""
REPORT_TIMEOUT = 5.0
_reported_failure = False


class CheckpointError(Exception):
    """A checkpoint that cannot be saved or loaded, with the reason in one line."""


def folder(directory: str | os.PathLike[str] | None = None) -> Path:
    """The checkpoint folder: `directory`, else the job's (GPUYARD_CHECKPOINT_DIR)."""
    chosen = directory if directory is not None else os.environ.get(DIR_VARIABLE)
    if not chosen:
        raise CheckpointError(
            f"no checkpoint folder: run inside a GPUYard job ({DIR_VARIABLE}) or pass directory="
        )
    return Path(chosen)


# ---------------------------------------------------------------- saving


def save(
    state: Any,
    step: int,
    *,
    keep: int = 3,
    directory: str | os.PathLike[str] | None = None,
) -> Path:
    """Save `state` as the checkpoint of `step` (a whole number from 0; saving a step again replaces it), then
    keep `keep` checkpoints (this one and the latest others, by step) and remove the older ones. `state`: bytes,
    a path (str or os.PathLike) of a file or folder to copy, or anything `torch.save` takes (a state dict).
    Returns the checkpoint's path. Raises CheckpointError with the reason (the previous checkpoints stay as they
    were)."""
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < 10**19:
        raise CheckpointError(f"step must be a whole number from 0, not {step!r}")
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise CheckpointError(f"keep must be a whole number from 1, not {keep!r}")
    where = folder(directory)
    try:
        where.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointError(f"cannot make the checkpoint folder {where}: {exc.strerror or exc}") from None
    kind = _kind(state)
    final = where / f"step-{step:020d}.{kind}"
    temporary = _temporary(final, secrets.token_hex(4))
    try:
        _write(state, kind, temporary)
        _replace(temporary, final)
        _sync_folder(where)
    except OSError as exc:
        raise CheckpointError(f"cannot save checkpoint {final}: {exc.strerror or exc}") from None
    except Exception as exc:  # (what torch.save refuses: an object it cannot pickle; no PyTorch installed)
        raise CheckpointError(f"cannot save checkpoint {final}: {type(exc).__name__}: {exc}") from None
    finally:
        _remove(temporary)
    size = _size(final)
    _prune(where, keep, final)
    _report(step, size)
    return final


def _kind(state: Any) -> str:
    if isinstance(state, bytes | bytearray | memoryview):
        return RAW
    if isinstance(state, str | os.PathLike):
        if not os.path.exists(state):
            raise CheckpointError(f"nothing to copy at {os.fspath(state)!r}")
        return COPY
    return TORCH


def _write(state: Any, kind: str, temporary: Path) -> None:
    """`state` written whole and flushed to disk under the temporary name."""
    if kind == COPY:
        source = Path(os.fspath(state))
        temporary.mkdir()
        inside = temporary / (source.name or "checkpoint")
        if source.is_dir():
            shutil.copytree(source, inside, symlinks=True)
        else:
            shutil.copy2(source, inside)
        _sync_tree(temporary)
        return
    with open(temporary, "xb") as out:
        if kind == RAW:
            out.write(state)
        else:
            import torch  # (only for a PyTorch object: the client does not need it)

            torch.save(state, out)
        out.flush()
        os.fsync(out.fileno())


def _sync_tree(top: Path) -> None:
    """Every file and folder under `top` (and `top`) flushed to disk."""
    for root, _, files in os.walk(top):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        _sync_folder(Path(root))


def _sync_folder(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _replace(temporary: Path, final: Path) -> None:
    """The temporary entry renamed to its final name (a folder that is there already is moved aside first: a
    folder cannot be renamed over another); other kinds of the same step go."""
    if final.is_dir() and not final.is_symlink():
        aside = _temporary(final, "old")
        os.replace(final, aside)
        os.replace(temporary, final)
        _remove(aside)
    else:
        os.replace(temporary, final)
    for other in (TORCH, RAW, COPY):
        sibling = final.with_suffix(f".{other}")
        if sibling != final:
            _remove(sibling)


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def _size(path: Path) -> int:
    if not path.is_dir():
        return path.stat().st_size
    return sum(
        os.lstat(os.path.join(root, name)).st_size for root, _, files in os.walk(path) for name in files
    )


def _prune(where: Path, keep: int, saved: Path) -> None:
    """Keep `keep` checkpoints: the one just `saved` and the latest others; remove what earlier saves that did
    not end left (`_leftover`)."""
    others = [path for _, path in _checkpoints(where) if path != saved]
    for path in others[: max(0, len(others) - (keep - 1))]:
        _remove(path)
    with os.scandir(where) as entries:
        for entry in entries:
            if entry.name.startswith(TEMPORARY) and _leftover(entry):
                _remove(Path(entry.path))


def _leftover(entry: os.DirEntry) -> bool:
    """Whether a temporary entry is one no save is writing any more: this host's, of a process that is gone,
    or older than STALE_SECONDS."""
    try:
        if time.time() - entry.stat(follow_symlinks=False).st_mtime > STALE_SECONDS:
            return True
    except FileNotFoundError:
        return False
    host, pid = _writer(entry.name)
    if host != socket.gethostname() or pid is None:
        return False
    if pid == os.getpid():
        return True  # (this process saves one checkpoint at a time: one left is of a save that failed)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _temporary(final: Path, mark: str) -> Path:
    """A temporary name beside `final`, saying which host and process writes it."""
    return final.with_name(f"{TEMPORARY}{socket.gethostname()}@{os.getpid()}~{mark}~{final.name}")


def _writer(name: str) -> tuple[str, int | None]:
    """The host and pid a temporary name says (`_temporary`; a host name holds neither '@' nor '~')."""
    host, _, pid = name.removeprefix(TEMPORARY).partition("~")[0].rpartition("@")
    return host, int(pid) if pid.isdigit() else None


# ---------------------------------------------------------------- reading


def _checkpoints(where: Path) -> list[tuple[int, Path]]:
    """The checkpoints in `where`, by step (one per step: the last written when two kinds of it are there)."""
    steps: dict[int, Path] = {}
    try:
        entries = list(os.scandir(where))
    except FileNotFoundError:
        return []
    for entry in sorted(entries, key=_mtime):
        match = NAME.fullmatch(entry.name)
        if match:
            steps[int(match.group(1))] = Path(entry.path)
    return sorted(steps.items())


def _mtime(entry: os.DirEntry) -> float:
    try:
        return entry.stat(follow_symlinks=False).st_mtime
    except FileNotFoundError:
        return 0.0


def latest_step(*, directory: str | os.PathLike[str] | None = None) -> int | None:
    """The step of the latest checkpoint; None when there is none."""
    found = _checkpoints(folder(directory))
    return found[-1][0] if found else None


def load_latest(
    *,
    directory: str | os.PathLike[str] | None = None,
    map_location: Any = None,
    weights_only: bool = True,
) -> tuple[int, Any] | None:
    """`(step, state)` of the latest checkpoint, or None when there is none (a job's first attempt). `state` is
    as it was saved: the PyTorch object (`torch.load` with `map_location` and `weights_only`), the bytes, or the
    path of the copied file or folder (inside the checkpoint: copy it elsewhere to change it)."""
    found = _checkpoints(folder(directory))
    if not found:
        return None
    step, path = found[-1]
    kind = path.suffix.removeprefix(".")
    try:
        if kind == RAW:
            return step, path.read_bytes()
        if kind == COPY:
            inside = list(path.iterdir())
            if len(inside) != 1:
                raise CheckpointError(f"checkpoint {path} holds {len(inside)} entries, not one")
            return step, inside[0]
        import torch  # (only for a PyTorch object: the client does not need it)

        with open(path, "rb") as f:
            return step, torch.load(f, map_location=map_location, weights_only=weights_only)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror or exc}") from None


# ---------------------------------------------------------------- reporting


def _report(step: int, size: int) -> None:
    """Tell the platform of the checkpoint (inside a job only); a report that fails is logged once."""
    global _reported_failure
    from gpuyard.shared.settings.client import ClientSettings

    settings = ClientSettings()
    job_id = os.environ.get("GPUYARD_JOB_ID")
    if not (job_id and settings.checkpoint_token and settings.server):
        return
    import httpx

    body = {"step": step, "size_bytes": size, "saved_at": datetime.now(UTC).isoformat()}
    url = f"{settings.server.rstrip('/')}/v1/jobs/{job_id}/checkpoints"
    try:
        response = httpx.post(
            url,
            json=body,
            headers={"Authorization": f"Bearer {settings.checkpoint_token}"},
            timeout=REPORT_TIMEOUT,
        )
        why = None if response.status_code < 300 else _detail(response)
    except httpx.HTTPError as exc:
        why = f"{type(exc).__name__}: {exc}"
    if why is None:
        return
    if not _reported_failure:
        _reported_failure = True
        log.warning("checkpoint of step %d saved, but not reported to the platform: %s", step, why)
    else:
        log.debug("checkpoint of step %d not reported: %s", step, why)


def _detail(response: Any) -> str:
    try:
        detail = response.json().get("detail")
    except ValueError:
        detail = None
    return f"{response.status_code} {detail or response.reason_phrase}"
