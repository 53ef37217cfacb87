"""The reaper itself (see `__init__.py`): its loop, the executor's requests and its answers, in order, the
replicas' starts (through the start helper, or a fork) and their ends. Standard library only."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import socket
import sys
import time
from collections import deque

from .child import become_replica
from .files import children, read_elsewhere, start_time, unread, write_atomically
from .helper import load_helper, spawn
from .kernel import subreaper

SOCKET_FD = 3
MAX_MESSAGE = 4 * 1024 * 1024
DRAIN_CHUNK = 64 * 1024


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
            become_replica(request, self.devnull, write_fd, error_w)
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
        while self.starting and (reply := self.starting[0].reply) is not None:
            start = self.starting.popleft()
            self.forked.pop(start.pid, None)
            self.send(reply)
            if start.replica is None:
                continue
            if start.status is None:
                self.replicas[start.pid] = start.replica
            else:
                self.ended(start.replica, start.status)

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
