"""Start a replica's process with the C library's posix_spawn: a few C calls where `subprocess.Popen` runs a
page of Python per start, and the executor waits less for the child to reach its exec (glibc spawns with
CLONE_VFORK: the executor's memory is not copied).

The child gets what `Popen(..., start_new_session=True)` gives it: a new session, stdin from /dev/null,
stdout and stderr to the given descriptor, no other inherited descriptor, SIGPIPE and SIGXFSZ back to their
default action (Python ignores them), the given working directory and environment, and the command looked up
on that environment's PATH. (glibc's two internal signals, 32 and 33, below SIGRTMIN, may start out ignored,
as they may after Popen; a program's C library installs its own handlers.) That needs glibc 2.34 or later
(chdir and closefrom as spawn actions); elsewhere `AVAILABLE` is False and the executor starts processes with
Popen.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

POSIX_SPAWN_SETSIGDEF = 0x04
POSIX_SPAWN_SETSID = 0x80  # glibc 2.26+
OPAQUE_BYTES = 1024  # more than posix_spawn_file_actions_t (80 bytes) and posix_spawnattr_t (336) need
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)  # ignored by Python, restored by Popen for its children

_NEEDED = {
    "posix_spawn": [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p]
    + [ctypes.POINTER(ctypes.c_char_p)] * 2,
    "posix_spawn_file_actions_init": [ctypes.c_void_p],
    "posix_spawn_file_actions_destroy": [ctypes.c_void_p],
    "posix_spawn_file_actions_addopen": [
        ctypes.c_void_p,
        ctypes.c_int,
        ctypes.c_char_p,
        ctypes.c_int,
        ctypes.c_uint,
    ],
    "posix_spawn_file_actions_adddup2": [ctypes.c_void_p, ctypes.c_int, ctypes.c_int],
    "posix_spawn_file_actions_addclosefrom_np": [ctypes.c_void_p, ctypes.c_int],
    "posix_spawn_file_actions_addchdir_np": [ctypes.c_void_p, ctypes.c_char_p],
    "posix_spawnattr_init": [ctypes.c_void_p],
    "posix_spawnattr_setflags": [ctypes.c_void_p, ctypes.c_short],
    "posix_spawnattr_setsigdefault": [ctypes.c_void_p, ctypes.c_void_p],
    "sigemptyset": [ctypes.c_void_p],
    "sigaddset": [ctypes.c_void_p, ctypes.c_int],
}


def _load():
    """The C library's functions and the spawn attributes every start shares; None where unavailable."""
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for name, argtypes in _NEEDED.items():
            fn = getattr(libc, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
    except (OSError, AttributeError):
        return None
    attr, defaults = ctypes.create_string_buffer(OPAQUE_BYTES), ctypes.create_string_buffer(OPAQUE_BYTES)
    calls = [libc.posix_spawnattr_init(attr), libc.sigemptyset(defaults)]
    calls += [libc.sigaddset(defaults, int(sig)) for sig in DEFAULT_SIGNALS]
    calls += [
        libc.posix_spawnattr_setsigdefault(attr, defaults),
        libc.posix_spawnattr_setflags(attr, POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGDEF),
    ]
    return (libc, attr) if not any(calls) else None


_LIBC = _load()
AVAILABLE = _LIBC is not None
_found: dict[tuple[str, str], bytes] = {}  # (command, PATH) -> where it was found last


def _encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")  # as os.fsencode on Linux


def _search(command: str, path_env: str, *, fresh: bool) -> bytes | None:
    """Where `command` is on `path_env` (remembered: a start costs no directory walk); None if nowhere."""
    key = (command, path_env)
    if not fresh and key in _found:
        return _found[key]
    for folder in path_env.split(os.pathsep):
        candidate = os.path.join(folder, command)
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            _found[key] = _encode(candidate)
            return _found[key]
    _found.pop(key, None)
    return None


def spawn(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], output_fd: int) -> int | None:
    """Start `argv` and return its pid; raises OSError as Popen would (FileNotFoundError: no such command;
    PermissionError: not executable). None when only Popen can do it: no posix_spawn here, or a relative
    entry in the PATH (the child would resolve it from its own working directory)."""
    if _LIBC is None:
        return None
    command = argv[0]
    path_env = env.get("PATH", os.defpath)
    if "/" not in command and any(not os.path.isabs(folder) for folder in path_env.split(os.pathsep)):
        return None
    lines = [f"{k}={v}" for k, v in env.items()]
    text = "\0".join([*argv, *lines])  # one pass to check them all
    if text.count("\0") != len(argv) + len(lines) - 1 or "\0" in str(cwd):
        raise ValueError("embedded null byte")  # (C strings would end at it)
    if "" in env or "=" in "".join(env):
        raise ValueError("illegal environment variable name")
    args = _encode(text).split(b"\0")
    argv_c = (ctypes.c_char_p * (len(argv) + 1))()
    argv_c[: len(argv)] = args[: len(argv)]
    envp_c = (ctypes.c_char_p * (len(lines) + 1))()
    envp_c[: len(lines)] = args[len(argv) :]
    for fresh in (False, True):
        executable = _encode(command) if "/" in command else _search(command, path_env, fresh=fresh)
        if executable is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), command)
        code, pid = _start(executable, argv_c, envp_c, _encode(str(cwd)), output_fd)
        if code == 0:
            return pid
        if code == errno.ENOENT and not os.path.isdir(cwd):
            raise FileNotFoundError(code, os.strerror(code), str(cwd))
        if code != errno.ENOENT or "/" in command or fresh:
            raise OSError(code, os.strerror(code), command)
    raise AssertionError("unreachable")  # pragma: no cover


def _start(executable: bytes, argv_c, envp_c, cwd: bytes, output_fd: int) -> tuple[int, int]:
    libc, attr = _LIBC
    actions = ctypes.create_string_buffer(OPAQUE_BYTES)
    pid = ctypes.c_int()
    if libc.posix_spawn_file_actions_init(actions):
        return errno.ENOMEM, 0
    try:
        steps = [
            libc.posix_spawn_file_actions_addopen(actions, 0, os.devnull.encode(), os.O_RDONLY, 0),
            libc.posix_spawn_file_actions_adddup2(actions, output_fd, 1),
            libc.posix_spawn_file_actions_adddup2(actions, output_fd, 2),
            libc.posix_spawn_file_actions_addclosefrom_np(actions, 3),
            libc.posix_spawn_file_actions_addchdir_np(actions, cwd),
        ]
        failed = next((code for code in steps if code), 0)
        if failed:
            return failed, 0
        return libc.posix_spawn(ctypes.byref(pid), executable, actions, attr, argv_c, envp_c), pid.value
    finally:
        libc.posix_spawn_file_actions_destroy(actions)
