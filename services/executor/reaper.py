"""The reaper: one small process per executor process, the parent of every replica that executor starts, which
outlives the executor so that no replica's end is ever lost (issue 24).

The executor starts it at its own start (`reaper_client.py`) and asks it, over a socket pair (its
descriptor's number is its argument), to start each replica; the reaper starts a child (below), which makes
itself the replica's first process: a new session, the cgroup of its limits, its user (issue 24 item 2: an
unprivileged one when the platform is root), stdin from /dev/null, stdout and stderr to the executor's pipe,
its working directory, then exec. The reaper does not wait for a forked child's exec before starting the
next or reaping others (a burst of starts execs in parallel);
each child's error pipe says, at its end, that the exec succeeded, or why the child could not start. Before
it answers with the pid, the reaper writes the replica's pid file (pid and start time), so an attempt is never
started twice, even when the executor dies right after asking. Answers go in the order of the requests.

When a replica's first process ends, the reaper writes its status to `replica-<r>.exit` (atomically, before
anything else), then tells the executor. If the executor is gone, nothing waits on it: the file is there for
the next executor, which reports it (`LocalBackend.adopt`). The reaper also keeps a read end of each replica's
output pipe, so a replica whose executor died never gets SIGPIPE: its output waits in the pipe (the replica
blocks when the pipe is full) until the next executor opens the pipe through `/proc/<reaper>/fd/<n>`. What a
replica printed last while no executor read its pipe, the reaper appends to the replica's log file itself.
An exit file the disk refuses (full) is written again at every turn of the reaper's loop until the disk takes
it; the reaper does not exit before.

Where the executor built the start helper (`replica_start.c`, a shared library, `start_helper.py`; its path
is the reaper's second argument), the reaper starts a replica through it: a vfork (nothing of the reaper's
memory is copied) whose child takes the steps that only the process itself can take, in C, then execs the
command. Without it (no C compiler on the node, or a library that cannot be loaded), the reaper forks and
its child takes the same steps in Python: about 1.4 ms more CPU per replica (`benchmarks/start_costs.py`).

Every replica's first process is a child subreaper (PR_SET_CHILD_SUBREAPER, kept across exec): a descendant
whose parent ends (`setsid sleep 1000 &`, a double fork) is re-parented to it, not to init, so nothing of the
replica escapes while it runs. When that first process ends, its remaining descendants are re-parented to the
reaper (a subreaper too), which kills every child it did not start itself, until none is left: nothing of a
job outlives its end, with or without cgroups.

The reaper exits when its executor is gone and it has no child left. It ignores SIGTERM, SIGINT and SIGHUP
(an executor's restart, or a platform upgrade, never ends a job; the executor stops jobs itself when it is
asked to). This file imports only the standard library: it runs as `python -I -S reaper.py`, and keeps
running the code it started with across an upgrade of the platform.

Messages are JSON, one per SOCK_SEQPACKET packet. Executor → reaper: a start (`argv`, `env`, `cwd`,
`pid_file`, `exit_file`, `log_file`, `record`: more fields of the pid file, `user`: [uid, gid] or null,
`cgroup`: a path or null, `binds`: [[source, target], …] or null and `hide_pids`: a mount namespace of the
replica's own, made while it is still root, with those folders bound over theirs and a proc with hidepid=2)
with two descriptors (the pipe's write end, for the replica, and a read end the reaper keeps). Reaper →
executor: `{"pid", "start", "fd"}` or `{"error": errno, "step", "message"}` for each start, in order, and
`{"exited": pid, "status": n}` (a negative status: killed by signal -n) for each end.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
import termios
import time
import warnings  # noqa: F401 (os.execvpe imports it on first use: in a child that already runs as the job's

# user, who may not read this Python's standard library, e.g. under a private /root)
from collections import deque

PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_SLAVE = 0x2, 0x4, 0x8, 0x1000, 0x4000, 0x80000
DEFAULT_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGPIPE,
    signal.SIGCHLD,
    signal.SIGXFSZ,
)
"""What a replica's first process gets back to the default: the reaper ignores (or handles) them."""
SOCKET_FD = 3
MAX_MESSAGE = 4 * 1024 * 1024
DRAIN_CHUNK = 64 * 1024

_libc = ctypes.CDLL(None, use_errno=True)


def subreaper() -> None:
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def private_mounts(binds: list[list[str]], hide_pids: bool) -> None:
    """A mount namespace of the calling process's own (it is root): mounts of the host still reach it (slave),
    none of its own goes back; each `[source, target]` bound over its target, then, with `hide_pids`, a proc
    of its own on /proc that shows only its user's processes. As replica_start.c's `private_mounts`."""

    def checked(result: int) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    checked(_libc.unshare(CLONE_NEWNS))
    checked(_libc.mount(None, b"/", None, MS_REC | MS_SLAVE, None))
    for source, target in binds:
        checked(_libc.mount(os.fsencode(source), os.fsencode(target), None, MS_BIND | MS_REC, None))
    if hide_pids:
        checked(_libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, b"hidepid=2"))


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (a zombie's too); None if it is gone."""
    try:  # (os.open and os.read: no file object to make, once per replica started)
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = os.read(fd, 4096).decode()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(stat[stat.rindex(")") + 2 :].split()[19])


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
    ]


class PrivateRequest(ctypes.Structure):
    """`struct gpuyard_private` of replica_start.c."""

    _fields_ = [("binds", ctypes.POINTER(ctypes.c_char_p)), ("hide_pids", ctypes.c_int)]


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
    )
    binds = request.get("binds") or []
    if binds or request.get("hide_pids"):
        private = PrivateRequest(
            binds=c_strings([os.fsencode(path) for pair in binds for path in pair]),
            hide_pids=1 if request.get("hide_pids") else 0,
        )
        pid = helper.gpuyard_start_private(ctypes.byref(start), ctypes.byref(private))
    else:
        pid = helper.gpuyard_start(ctypes.byref(start))
    if pid < 0:
        raise OSError(-pid, os.strerror(-pid))
    return pid


def write_atomically(path: str, doc: dict) -> None:
    """`path` holds `doc` whole, or (an OSError: a full disk) is left as it was, without a partial file."""
    temporary = f"{path}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        try:
            data = json.dumps(doc).encode()
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        finally:
            os.close(fd)
        os.rename(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def children() -> set[int]:
    """This process's children, from /proc (each thread's list; the reaper has one thread)."""
    found: set[int] = set()
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as f:
            found.update(int(p) for p in f.read().split())
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN: scan every process's parent
        me = os.getpid()
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat", "rb") as f:
                        stat = f.read().decode()
                except OSError:
                    continue
                if int(stat[stat.rindex(")") + 2 :].split()[1]) == me:
                    found.add(int(name))
    return found


def unread(fd: int) -> int:
    """Bytes waiting in a pipe."""
    try:
        return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def read_elsewhere(exit_file: str) -> bool:
    """Whether a live executor that adopted the replica reads its output (its pid in `replica-<r>.reader`):
    then the rest of the output is that executor's to read, to the pipe's end, not the reaper's to take."""
    try:
        with open(exit_file.removesuffix(".exit") + ".reader") as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


class Replica:
    __slots__ = ("pid", "exit_file", "log_file", "read_fd")

    def __init__(self, pid: int, exit_file: str, log_file: str, read_fd: int):
        self.pid, self.exit_file, self.log_file, self.read_fd = pid, exit_file, log_file, read_fd


class Starting:
    """A start asked for: its child forked and not yet known to have exec'd (or failed), or its answer ready
    and waiting for the answers before it."""

    __slots__ = ("request", "pid", "started", "error_r", "failure", "kept", "status", "reply", "replica")

    def __init__(self, request: dict, reply: dict | None = None):
        self.request = request
        self.pid = 0
        self.started: int | None = None
        self.error_r = -1  # the child's error pipe, until its end
        self.failure = b""
        self.kept = -1  # the reaper's read end of the replica's output pipe
        self.status: int | None = None  # the child ended before its start was answered
        self.reply = reply
        self.replica: Replica | None = None  # what the reaper follows once the start is answered


class Reaper:
    def __init__(self, sock: socket.socket, helper: str = ""):
        self.sock = sock
        self.helper = load_helper(helper)  # None: fork
        self.connected = True
        self.replicas: dict[int, Replica] = {}
        self.finishing: dict[int, tuple[Replica, int]] = {}
        """Ended replicas whose output the executor is still reading, by the reaper's end of their pipe."""
        self.unwritten: dict[str, dict] = {}
        """Exit files the disk refused (full), by path: written again each turn of the loop until it takes them."""
        self.outbox: deque[bytes] = deque()
        self.starting: deque[Starting] = deque()  # in the order asked
        self.forked: dict[int, Starting] = {}  # pid -> its start, until answered
        self.waiting_exec: dict[int, Starting] = {}  # error pipe -> its start
        self.devnull = os.open(os.devnull, os.O_RDONLY)
        self.pid = os.getpid()
        self.started = start_time(self.pid)
        self.wakeup_r, self.wakeup_w = os.pipe()
        os.set_blocking(self.wakeup_r, False)
        os.set_blocking(self.wakeup_w, False)

    # ------------------------------------------------------------------ the loop

    def run(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_IGN)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes the poll below through the wakeup pipe
        signal.set_wakeup_fd(self.wakeup_w)
        subreaper()
        poll = select.poll()
        poll.register(self.wakeup_r, select.POLLIN)
        self.sock.setblocking(False)
        poll.register(self.sock, select.POLLIN)
        self.poll = poll
        self.reap()  # (a child that ended before the handler was set)
        while self.connected or self.has_children() or self.finishing or self.starting or self.unwritten:
            try:
                events = poll.poll(100 if self.finishing else 1000)
            except InterruptedError:
                continue
            for fd, mask in events:
                if fd == self.wakeup_r:
                    while True:
                        try:
                            if not os.read(self.wakeup_r, 4096):
                                break
                        except BlockingIOError:
                            break
                    self.reap()
                elif fd in self.waiting_exec:
                    self.exec_news(self.waiting_exec[fd])
                elif mask & (select.POLLIN | select.POLLHUP | select.POLLERR):
                    self.receive()
                if fd == self.sock.fileno() and mask & select.POLLOUT:
                    self.flush()
            if self.connected:
                flags = select.POLLIN | (select.POLLOUT if self.outbox else 0)
                poll.modify(self.sock, flags)
            elif self.sock.fileno() >= 0:
                poll.unregister(self.sock)
                self.sock.close()
            self.reap()  # a SIGCHLD that arrived between two reads of the wakeup pipe
            self.finish_read()
            self.write_again()

    def has_children(self) -> bool:
        return bool(self.replicas) or bool(children())

    # ------------------------------------------------------------------ the executor's side

    def receive(self) -> None:
        while self.connected:
            try:
                data, fds, _flags, _addr = socket.recv_fds(self.sock, MAX_MESSAGE, 2)
            except BlockingIOError:
                return
            except OSError:
                data, fds = b"", []
            if not data:
                self.disconnected()
                return
            try:
                self.start(json.loads(data), fds)
            finally:
                for fd in fds:
                    os.close(fd)
            self.answer()

    def send(self, doc: dict) -> None:
        if self.connected:
            self.outbox.append(json.dumps(doc).encode())
            self.flush()

    def flush(self) -> None:
        while self.outbox and self.connected:
            try:
                self.sock.send(self.outbox[0])
            except BlockingIOError:
                return
            except OSError:
                self.disconnected()
                return
            self.outbox.popleft()

    def disconnected(self) -> None:
        """The executor is gone: its replicas go on; their ends are only written down from now on."""
        self.connected = False
        self.outbox.clear()

    # ------------------------------------------------------------------ starting a replica

    def start(self, request: dict, fds: list[int]) -> None:
        """Fork the replica's first process; its answer comes once its exec is known to have happened."""
        if len(fds) != 2:
            error = {"error": errno.EINVAL, "step": "request", "message": "a start needs two descriptors"}
            self.starting.append(Starting(request, error))
            return
        write_fd, read_fd = fds
        start = Starting(request)
        error_r, error_w = os.pipe()  # both close on exec: the child's exec closes error_w
        try:
            start.pid = self.launch(request, write_fd, error_w)
        except (OSError, ValueError) as exc:  # (ValueError: a NUL byte, or an `=` in a variable's name)
            os.close(error_r)
            step = "exec" if isinstance(exc, ValueError) else "spawn"
            code = (exc.errno or 0) if isinstance(exc, OSError) else 0
            self.starting.append(Starting(request, {"error": code, "step": step, "message": str(exc)}))
            return
        finally:
            os.close(error_w)
        start.started = start_time(start.pid)
        start.kept = os.dup(read_fd)  # (the received descriptors are closed once this returns)
        start.error_r = error_r
        os.set_blocking(error_r, False)
        self.starting.append(start)
        self.forked[start.pid] = start
        self.waiting_exec[error_r] = start
        self.poll.register(error_r, select.POLLIN)

    def launch(self, request: dict, write_fd: int, error_w: int) -> int:
        """The replica's first process: started through the start helper, or a fork of the reaper (no helper,
        or one that could not be loaded)."""
        if self.helper is not None:
            return spawn(self.helper, request, self.devnull, write_fd, error_w)
        pid = os.fork()
        if pid == 0:  # pragma: no cover (the child: it execs or exits)
            self.child(request, write_fd, error_w)
        return pid

    def exec_news(self, start: Starting) -> None:
        """The child's error pipe has something: why it could not start, or its end (the exec happened, or
        the child exited after saying why)."""
        while True:
            try:
                chunk = os.read(start.error_r, 4096)
            except BlockingIOError:
                return
            if not chunk:
                break
            start.failure += chunk
        self.poll.unregister(start.error_r)
        del self.waiting_exec[start.error_r]
        os.close(start.error_r)
        start.error_r = -1
        start.reply = self.started_or_not(start)
        self.answer()

    def started_or_not(self, start: Starting) -> dict:
        """The answer for a start whose exec is settled: the replica's, once its pid file is written, or why it
        failed."""
        if start.failure:
            if start.status is None:
                os.waitpid(start.pid, 0)  # it has exited (127) or is exiting
            os.close(start.kept)
            step, _, rest = start.failure.decode(errors="replace").partition(":")
            code, _, message = rest.partition(":")
            return {"error": int(code or 0), "step": step, "message": message}
        request, pid = start.request, start.pid
        record = {**request.get("record", {}), "pid": pid, "start": start.started}
        record.update(reaper=self.pid, reaper_start=self.started, fd=start.kept)
        try:
            write_atomically(request["pid_file"], record)
        except OSError as exc:  # (the folder was removed meanwhile): the replica cannot be found again
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            if start.status is None:
                os.waitpid(pid, 0)
            os.close(start.kept)
            return {"error": exc.errno or errno.EIO, "step": "pid_file", "message": str(exc)}
        start.replica = Replica(pid, request["exit_file"], request.get("log_file") or "", start.kept)
        return {"pid": pid, "start": start.started, "fd": start.kept}

    def answer(self) -> None:
        """Send the answers that are ready, in the order the starts were asked. A replica is followed from its
        answer on (its end is never told before its start); one that ended before is reported ended right
        after it."""
        while self.starting and self.starting[0].reply is not None:
            start = self.starting.popleft()
            self.forked.pop(start.pid, None)
            self.send(start.reply)
            if start.replica is None:
                continue
            if start.status is None:
                self.replicas[start.pid] = start.replica
            else:
                self.ended(start.replica, start.status)

    def child(self, request: dict, write_fd: int, error_w: int) -> None:
        """In the forked child: become the replica's first process, or say which step failed and exit."""
        step = "setup"
        try:
            signal.set_wakeup_fd(-1)
            for sig in DEFAULT_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            os.setsid()
            subreaper()
            if request.get("cgroup"):
                step = "cgroup"
                procs = os.path.join(request["cgroup"], "cgroup.procs")
                fd = os.open(
                    procs, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600
                )  # (as a shell's `>` opens it)
                os.write(fd, str(os.getpid()).encode())
                os.close(fd)
            step = "setup"
            os.dup2(self.devnull, 0)
            os.dup2(write_fd, 1)
            os.dup2(write_fd, 2)
            if request.get("binds") or request.get("hide_pids"):
                step = "namespace"
                private_mounts(request.get("binds") or [], bool(request.get("hide_pids")))
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

    # ------------------------------------------------------------------ ends

    def reap(self) -> None:
        reaped = False
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reaped = True
            replica = self.replicas.pop(pid, None)
            if replica is not None:
                self.ended(replica, os.waitstatus_to_exitcode(status))
            elif (start := self.forked.get(pid)) is not None:  # ended before its start was answered
                start.status = os.waitstatus_to_exitcode(status)
        if reaped:
            self.kill_leftovers()

    def ended(self, replica: Replica, status: int) -> None:
        """The replica's first process ended: its executor is told at once, and reads the rest of the output
        itself; the reaper keeps its end of the pipe until the pipe is empty (`finish_read`), so that what an
        executor that dies meanwhile leaves unread still reaches the log file."""
        if self.connected:
            self.send({"exited": replica.pid, "status": status})
        if self.connected and unread(replica.read_fd):
            self.finishing[replica.read_fd] = (replica, status)
        else:
            self.finish(replica, status)

    def finish_read(self) -> None:
        """The replicas whose output the executor has read to the end are done with; all of them when no
        executor reads any more (the rest then goes to their log files)."""
        for fd, (replica, status) in list(self.finishing.items()):
            if not self.connected or unread(fd) == 0:
                del self.finishing[fd]
                self.finish(replica, status)

    def finish(self, replica: Replica, status: int) -> None:
        if replica.log_file and unread(replica.read_fd) and not read_elsewhere(replica.exit_file):
            self.drain(replica)  # (before the exit file: once it exists, the log file holds all the output)
        doc = {"pid": replica.pid, "status": status, "ended": time.time()}
        try:
            write_atomically(replica.exit_file, doc)
        except FileNotFoundError:  # its folder is gone (the job's directory deleted): no one will read it
            pass
        except OSError:  # a full disk: the reaper writes it again until the disk takes it (`write_again`)
            self.unwritten[replica.exit_file] = doc
        os.close(replica.read_fd)

    def write_again(self) -> None:
        """The exit files the disk refused, tried again; those it still refuses wait for the next turn."""
        for path, doc in list(self.unwritten.items()):
            try:
                write_atomically(path, doc)
            except FileNotFoundError:
                del self.unwritten[path]
            except OSError:
                return  # (still full: the others would fail the same)
            else:
                del self.unwritten[path]

    def drain(self, replica: Replica) -> None:
        """No executor reads the replica's output: append what is left in its pipe to its log file."""
        os.set_blocking(replica.read_fd, False)
        try:
            out = os.open(replica.log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError:
            return
        try:
            while True:
                try:
                    data = os.read(replica.read_fd, DRAIN_CHUNK)
                except BlockingIOError:
                    break
                if not data:
                    break
                os.write(out, data)
        except OSError:
            pass
        finally:
            os.close(out)

    def kill_leftovers(self) -> None:
        """Every child the reaper did not start is what is left of a replica whose first process ended (a
        live replica's first process is the subreaper of its own descendants): killed."""
        for pid in children() - self.replicas.keys() - self.forked.keys():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def main() -> None:
    fd = int(sys.argv[1]) if len(sys.argv) > 1 else SOCKET_FD
    os.set_inheritable(fd, False)
    sock = socket.socket(fileno=fd)
    Reaper(sock, helper=sys.argv[2] if len(sys.argv) > 2 else "").run()


if __name__ == "__main__":
    main()
