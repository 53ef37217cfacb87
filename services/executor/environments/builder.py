"""The build of one environment with uv: `uv venv` from a system interpreter, then `uv pip install` of its
requirements, in a temporary folder of the environments' root renamed to `<root>/<key>` once whole (a crash
never leaves a half environment that looks whole: a folder of that name is always a finished one).

One build at a time per key on a node: an asyncio lock within the executor, a file lock between its processes;
a second job that wants the environment waits for the first one's build and uses what it built."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from gpuyard.shared.contracts.jobspec import EnvironmentSpec, environment_key, packages_summary
from gpuyard.shared.runtime.installhint import install_command
from gpuyard.shared.settings.environments import EnvironmentSettings

META = "gpuyard-environment.json"
"""What an environment is (key, python, packages, size, when built): written last, before the rename."""
USED = ".gpuyard-used"
"""Touched at each use: its modification time is when a job last used the environment."""
BUILDING = ".building-"
TAIL_LINES = 20

Output = Callable[[bytes], None]
"""Where the build's output goes (the job's log)."""


class BuildFailed(Exception):
    """The environment could not be built: why, in words, with the builder's last lines."""

    def __init__(self, message: str, tail: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.tail = tail or []

    @property
    def text(self) -> str:
        """The message, then the builder's last lines (the job's failure message and `describe`)."""
        return "\n".join([self.message, *self.tail]) if self.tail else self.message


@dataclass(frozen=True)
class Built:
    key: str
    path: Path
    python: str
    reused: bool


def uv_binary() -> str:
    """uv's program, as its Python package installs it (the platform extra)."""
    try:
        import uv  # (the platform extra's: imported where a build needs it)

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        raise BuildFailed(
            f"uv, which builds job environments, is not installed on this node: {install_command('platform')}"
        ) from None


class EnvironmentBuilder:
    def __init__(self, root: Path, settings: EnvironmentSettings, pythons: dict[str, str], *, uv: str = ""):
        self.root = root
        self.settings = settings
        self.pythons = pythons
        self.uv = uv
        self.locks: dict[str, asyncio.Lock] = collections.defaultdict(asyncio.Lock)

    def key_of(self, env: EnvironmentSpec, python: str) -> str:
        return environment_key(env, python=python, builder=self.settings.builder_settings())

    async def ensure(self, env: EnvironmentSpec, python: str, output: Output) -> Built:
        """The environment, built now or found built; BuildFailed when it cannot be."""
        key = self.key_of(env, python)
        final = self.root / key
        async with self.locks[key]:
            if (final / META).is_file():
                return self._reused(key, final, python, output)
            lock = await asyncio.to_thread(_file_lock, self.root / ".locks" / f"{key}.lock")
            try:
                if (final / META).is_file():  # (another executor process of the node built it meanwhile)
                    return self._reused(key, final, python, output)
                await self._build(env, key, python, output)
            finally:
                os.close(lock)
        return Built(key, final, python, reused=False)

    def _reused(self, key: str, final: Path, python: str, output: Output) -> Built:
        output(f"gpuyard: reusing environment {key} (python {python})\n".encode())
        touch_used(final)
        return Built(key, final, python, reused=True)

    async def _build(self, env: EnvironmentSpec, key: str, python: str, output: Output) -> None:
        interpreter = self.pythons[python]
        what = packages_summary(env.pip)
        output(f"gpuyard: building environment {key} (python {python}: {what})\n".encode())
        for old in self.root.glob(f"{BUILDING}{key}-*"):  # (a build that died: its lock is ours now)
            await asyncio.to_thread(shutil.rmtree, old, True)
        folder = self.root / f"{BUILDING}{key}-{secrets.token_hex(4)}"
        started = time.monotonic()
        try:
            uv = self.uv or uv_binary()
            await self._run([uv, "venv", "--relocatable", "--python", interpreter, str(folder)], output)
            if env.pip:
                await self._run(self.install_argv(folder, env.pip), output)
            size = await asyncio.to_thread(folder_size, folder)
            meta = {
                "key": key,
                "python": python,
                "pip": env.pip,
                "size_bytes": size,
                "built_at": datetime.now(UTC).isoformat(),
            }
            (folder / META).write_text(json.dumps(meta, indent=1))
            touch_used(folder)
            os.rename(folder, self.root / key)
        except BaseException:
            await asyncio.to_thread(shutil.rmtree, folder, True)
            raise
        output(f"gpuyard: built environment {key} in {time.monotonic() - started:.1f}s\n".encode())

    def install_argv(self, folder: Path, pip: list[str]) -> list[str]:
        s = self.settings
        argv = [self.uv or uv_binary(), "pip", "install", "--python", str(folder / "bin" / "python")]
        if s.environment_index_url:
            argv += ["--index-url", s.environment_index_url]
        for link in s.builder_settings()[1:]:
            argv += ["--find-links", link]
        if s.environment_offline:
            argv += ["--offline", "--no-index"]
        if not s.environment_source_builds:
            argv.append("--no-build")
        return [*argv, "--", *pip]

    def uv_env(self) -> dict[str, str]:
        """uv's environment: system interpreters only, never one it downloads; its cache in the root (same
        filesystem: packages are linked, not copied); no user's or project's uv configuration."""
        keep = (
            "PATH",
            "HOME",
            "LANG",
            "LC_ALL",
            "SSL_CERT_FILE",
            "SSL_CERT_DIR",
            "HTTP_PROXY",
            "HTTPS_PROXY",
        )
        env = {k: os.environ[k] for k in keep if k in os.environ}
        env.update(
            UV_PYTHON_PREFERENCE="only-system",
            UV_PYTHON_DOWNLOADS="never",
            UV_CACHE_DIR=str(self.root / ".cache"),
            UV_NO_CONFIG="1",
            UV_NO_PROGRESS="1",
            NO_COLOR="1",
        )
        return env

    async def _run(self, argv: list[str], output: Output) -> None:
        """Run one step, its output streamed to `output`; BuildFailed with its last lines when it fails or
        outlasts the build timeout."""
        tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=self.uv_env(),  # (its files readable and runnable by the jobs' users: the executor's
                start_new_session=True,  # umask, JOB_UMASK, is the usual one)
            )
        except OSError as exc:
            raise BuildFailed(f"cannot run {argv[0]}: {exc.strerror or exc}") from None
        stdout = proc.stdout
        assert stdout is not None

        async def pump() -> None:
            async for line in stdout:
                output(line)
                tail.append(line.decode(errors="replace").rstrip())

        try:
            await asyncio.wait_for(
                asyncio.gather(pump(), proc.wait()), self.settings.environment_build_timeout
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            await proc.wait()
            raise BuildFailed(
                f"the environment's build took longer than {self.settings.environment_build_timeout:g}s",
                list(tail),
            ) from None
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            raise
        if proc.returncode:
            step = "uv venv" if argv[1] == "venv" else "uv pip"
            raise BuildFailed(
                f"building the environment failed ({step} exited {proc.returncode})", list(tail)
            )


def _file_lock(path: Path) -> int:
    """Hold the build lock of one key between the node's executor processes (released by closing it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def touch_used(folder: Path) -> None:
    with contextlib.suppress(OSError):
        (folder / USED).touch()


def folder_size(folder: Path) -> int:
    """Bytes of the files under `folder` (links not followed, hard links counted once)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for path, _dirs, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(path, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total
