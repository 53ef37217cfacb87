"""Local process backend: each replica is its own process group, its output in a log file on disk."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from services.executor.classify import classify_log_tail
from shared.events import FailureReason


class StartError(Exception):
    def __init__(self, reason: FailureReason, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass
class ReplicaProcess:
    job_id: str
    attempt: int
    replica: int
    proc: asyncio.subprocess.Process
    log_path: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def running(self) -> bool:
        return self.proc.returncode is None


async def start_replica(
    argv: list[str], cwd: Path, env: dict[str, str], log_path: Path
) -> asyncio.subprocess.Process:
    """Start one replica in a new session (its own process group), stdout and stderr to `log_path`."""
    if not cwd.is_dir():
        raise StartError(FailureReason.START_FAILED, f"working directory {cwd} does not exist")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        try:
            return await asyncio.create_subprocess_exec(
                *argv,
                cwd=cwd,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except FileNotFoundError:
            raise StartError(FailureReason.COMMAND_NOT_FOUND, f"command not found: {argv[0]}") from None
        except PermissionError:
            raise StartError(
                FailureReason.START_FAILED, f"permission denied: {argv[0]} is not executable"
            ) from None
        except OSError as exc:
            raise StartError(
                FailureReason.START_FAILED, f"cannot start {argv[0]}: {exc.strerror or exc}"
            ) from None


def signal_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def terminate(proc: asyncio.subprocess.Process, grace: float) -> None:
    """SIGTERM to the whole process group, SIGKILL after `grace` seconds."""
    if proc.returncode is not None:
        signal_group(proc, signal.SIGKILL)  # leftovers of the group
        return
    signal_group(proc, signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        signal_group(proc, signal.SIGKILL)
        await proc.wait()
    signal_group(proc, signal.SIGKILL)


def log_tail(path: Path, lines: int = 20) -> list[str]:
    if not path.exists():
        return []
    with path.open("r", errors="replace") as f:
        return [line.rstrip("\n") for line in deque(f, maxlen=lines)]


def classify_exit(
    returncode: int, tail: list[str], shell: bool
) -> tuple[FailureReason | None, int | None, int | None, str]:
    """(reason, exit_code, signal, message) for a replica's return code; reason None means success."""
    if returncode == 0:
        return None, 0, None, ""
    if returncode < 0:
        sig = -returncode
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        if sig == signal.SIGKILL:
            return FailureReason.SIGNAL, None, sig, f"killed by {name} (out of memory, or killed by someone)"
        return FailureReason.SIGNAL, None, sig, f"killed by {name}"
    if classify_log_tail(tail) == FailureReason.CUDA_OOM:
        return FailureReason.CUDA_OOM, returncode, None, "CUDA out of memory (seen in the log)"
    if shell and returncode == 127:
        return (
            FailureReason.COMMAND_NOT_FOUND,
            returncode,
            None,
            "command not found (exit code 127 from the shell)",
        )
    if returncode > 128 and returncode - 128 in signal.Signals._value2member_map_:
        name = signal.Signals(returncode - 128).name
        return (
            FailureReason.EXIT_CODE,
            returncode,
            None,
            f"exited with code {returncode} (a child got {name})",
        )
    return FailureReason.EXIT_CODE, returncode, None, f"exited with code {returncode}"
