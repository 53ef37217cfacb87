"""A replica's first process, in Python: the reaper's forked child takes the steps only the process itself
can take (a new session, a child subreaper, its folders, its cgroup, its descriptors, a mount namespace of its
own, its user, its working directory), then execs the command; where the start helper is loaded, its C does the same
instead (`helper.py`). Standard library only (see `__init__.py`)."""

from __future__ import annotations

import os
import signal

# os.execvpe imports `warnings` on its first use: in a child that already runs as the job's user, who may not
# read this Python's standard library (under a private /root), it must have been imported before
import warnings  # noqa: F401

from .folders import make_folders
from .kernel import private_mounts, subreaper

DEFAULT_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGPIPE,
    signal.SIGCHLD,
    signal.SIGXFSZ,
)
"""What a replica's first process gets back to the default: the reaper ignores (or handles) them."""


def become_replica(request: dict, devnull: int, write_fd: int, error_w: int) -> None:
    """In the forked child: become the replica's first process, or say which step failed (on `error_w`) and
    exit. `devnull`: its stdin; `write_fd`: its stdout and stderr."""
    step = "setup"
    try:
        signal.set_wakeup_fd(-1)
        for sig in DEFAULT_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
        os.setsid()
        subreaper()
        if request.get("folders"):
            step = "folders"  # (before its cgroup: their kernel memory is not charged to the job's)
            make_folders(request["folders"])
        if request.get("cgroup"):
            step = "cgroup"
            procs = os.path.join(request["cgroup"], "cgroup.procs")
            fd = os.open(procs, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # (as a shell's `>` opens it)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
        step = "setup"
        os.dup2(devnull, 0)
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        if request.get("binds") or request.get("hide_pids"):
            step = "namespace"
            private_mounts(
                request.get("binds") or [], bool(request.get("hide_pids")), request.get("read_only") or []
            )
        user = request.get("user")
        if user:
            step = "user"
            os.setgroups([])
            os.setgid(user[1])
            os.setuid(user[0])
        step = "cwd"
        os.chdir(request["cwd"])
        step = "setup"
        os.closerange(3, error_w)
        os.closerange(error_w + 1, 1 << 20)
        step = "exec"
        argv = request["argv"]
        os.execvpe(argv[0], argv, request["env"])
    except OSError as exc:
        message = exc.strerror or str(exc)
        os.write(error_w, f"{step}:{exc.errno or 0}:{message}".encode(errors="replace"))
    except BaseException as exc:  # noqa: BLE001 (nothing may escape a forked child)
        os.write(error_w, f"{step}:0:{exc}".encode(errors="replace"))
    finally:
        os._exit(127)
