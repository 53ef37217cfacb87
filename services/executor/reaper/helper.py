"""The start helper's binding (`replica_start.c`, a shared library the executor builds: `start_helper.py`):
the reaper starts a replica through it, a vfork (nothing of the reaper's memory is copied) whose child takes
the steps only the process itself can take, in C, then execs the command. Standard library only (see
`__init__.py`)."""

from __future__ import annotations

import ctypes
import os
import sys


class StartRequest(ctypes.Structure):
    """`struct gpuyard_start` of replica_start.c."""

    _fields_ = [
        ("paths", ctypes.POINTER(ctypes.c_char_p)),
        ("argv", ctypes.POINTER(ctypes.c_char_p)),
        ("envp", ctypes.POINTER(ctypes.c_char_p)),
        ("stdin_fd", ctypes.c_int),
        ("output_fd", ctypes.c_int),
        ("error_fd", ctypes.c_int),
        ("cgroup_procs", ctypes.c_char_p),
        ("uid", ctypes.c_long),
        ("gid", ctypes.c_long),
        ("cwd", ctypes.c_char_p),
        ("folders", ctypes.POINTER(ctypes.c_char_p)),
        ("folder_ids", ctypes.POINTER(ctypes.c_long)),
    ]


class PrivateRequest(ctypes.Structure):
    """`struct gpuyard_private` of replica_start.c."""

    _fields_ = [
        ("binds", ctypes.POINTER(ctypes.c_char_p)),
        ("hide_pids", ctypes.c_int),
        ("read_only", ctypes.POINTER(ctypes.c_char_p)),
    ]


def load_helper(path: str) -> ctypes.CDLL | None:
    """The start helper's library; None where it cannot be loaded (gone, or a folder mounted noexec)."""
    if not path:
        return None
    try:
        library = ctypes.CDLL(path)
        library.gpuyard_start.argtypes = [ctypes.POINTER(StartRequest)]
        library.gpuyard_start.restype = ctypes.c_long
        library.gpuyard_start_private.argtypes = [
            ctypes.POINTER(StartRequest),
            ctypes.POINTER(PrivateRequest),
        ]
        library.gpuyard_start_private.restype = ctypes.c_long
    except (OSError, AttributeError) as exc:
        print(f"gpuyard reaper: cannot load {path} ({exc}); forking instead", file=sys.stderr)
        return None
    return library


def c_strings(items: list[bytes]) -> ctypes.Array:
    """A NULL-terminated `char *[]`; ValueError for a NUL byte in one (as os.execve)."""
    for item in items:
        if b"\0" in item:
            raise ValueError("embedded null byte")
    return (ctypes.c_char_p * (len(items) + 1))(*items, None)


def spawn(helper: ctypes.CDLL, request: dict, stdin: int, output: int, error_w: int) -> int:
    """Start the replica through the start helper (replica_start.c): its pid once its child has exec'd or
    failed (then `error_w` holds why). The command is looked up here on the replica's own PATH, as
    os.execvpe does."""
    argv, env = request["argv"], request["env"]
    names = [os.fsencode(key) for key in env]
    if any(not name or b"=" in name for name in names):
        raise ValueError("illegal environment variable name")
    command = os.fsencode(argv[0])
    if b"/" in command:
        paths = [command]
    else:
        paths = [os.path.join(os.fsencode(folder), command) for folder in os.get_exec_path(env)]
    user = request.get("user")
    cgroup = request.get("cgroup")
    folders = request.get("folders") or []
    start = StartRequest(
        paths=c_strings(paths),
        argv=c_strings([os.fsencode(arg) for arg in argv]),
        envp=c_strings(
            [name + b"=" + os.fsencode(value) for name, value in zip(names, env.values(), strict=True)]
        ),
        stdin_fd=stdin,
        output_fd=output,
        error_fd=error_w,
        cgroup_procs=os.fsencode(os.path.join(cgroup, "cgroup.procs")) if cgroup else None,
        uid=user[0] if user else -1,
        gid=user[1] if user else -1,
        cwd=os.fsencode(request["cwd"]),
        folders=c_strings([os.fsencode(folder[0]) for folder in folders]) if folders else None,
        folder_ids=(ctypes.c_long * (3 * len(folders) + 1))(*(n for folder in folders for n in folder[1:4])),
    )
    binds = request.get("binds") or []
    if binds or request.get("hide_pids"):
        private = PrivateRequest(
            binds=c_strings([os.fsencode(path) for pair in binds for path in pair]),
            hide_pids=1 if request.get("hide_pids") else 0,
            read_only=c_strings([os.fsencode(target) for target in request.get("read_only") or []]),
        )
        pid = helper.gpuyard_start_private(ctypes.byref(start), ctypes.byref(private))
    else:
        pid = helper.gpuyard_start(ctypes.byref(start))
    if pid < 0:
        raise OSError(-pid, os.strerror(-pid))
    return pid
