"""A replica's log on disk: size-capped, rotated, and the one definition of how its files are named.

One attempt of one replica writes `replica-<r>.log`; when that file reaches `max_bytes` it becomes
`replica-<r>.log.1` (the previous `.1` becomes `.2`, …) and a new `replica-<r>.log` starts. At most `backups`
rotated files are kept; older output is deleted, so a replica never holds more than
`max_bytes * (backups + 1)` bytes of log. The names are defined once, in `gpuyard.shared.runtime.paths` (`backup_path`,
`log_files`), which readers such as the submit API use too.

A tenant's running replicas together hold at most its log budget (`LogBudget`, GPUYARD_TENANT_LOG_BUDGET) of
this executor's logs: beyond it, what they print is dropped, after a line in each log that says so, until some
of it is freed (a replica of the tenant ends); a line then says how much was dropped. A write the disk refuses
(full: ENOSPC) never stops the executor or the replica: what cannot be written is dropped, the executor says
so once, and the next line written says how much is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections import deque
from pathlib import Path

from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.runtime.paths import backup_path, log_files, private_dir
from gpuyard.shared.settings.names import env_name
from gpuyard.shared.stores.logs import NOTE, LogKey
from gpuyard.shared.stores.logs.shipper import LogShipper

log = logging.getLogger(__name__)
READ_CHUNK = 256 * 1024
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
BUDGET_SETTING = env_name("tenant_log_budget")
_write = os.write  # (a test's disk may refuse)
NEWLINE = ord("\n")


class LogBudget:
    """The bytes of log each tenant's running replicas may hold in this executor process, together: their log
    files, rotated ones included, from their start (or adoption) to their end. `limit` 0: no limit. The node's
    executor processes share the setting equally (`share`)."""

    def __init__(self, limit: int):
        if limit < 0:
            raise ValueError("a log budget cannot be negative")
        self.limit = limit
        self.held: dict[str, int] = {}
        self.freed: dict[str, int] = {}
        """Bytes given back per tenant, ever: a log truncated at the budget resumes only once this grew."""

    @classmethod
    def share(cls, per_node: int, workers: int) -> LogBudget:
        """This process's share of a node's budget per tenant (`workers`: the node's executor processes)."""
        share = per_node // max(workers, 1)
        return cls(max(share, 1) if per_node > 0 else per_node)  # (a share never rounds down to no limit)

    def fits(self, tenant: str, size: int) -> bool:
        return not self.limit or self.held.get(tenant, 0) + size <= self.limit

    def room(self, tenant: str, wanted: int) -> int:
        """How many of `wanted` more bytes fit in the tenant's budget."""
        return wanted if not self.limit else max(0, min(wanted, self.limit - self.held.get(tenant, 0)))

    def take(self, tenant: str, size: int) -> None:
        self.held[tenant] = self.held.get(tenant, 0) + size

    def give_back(self, tenant: str, size: int) -> None:
        if size > 0:
            self.freed[tenant] = self.freed.get(tenant, 0) + size
        left = self.held.get(tenant, 0) - size
        if left > 0:
            self.held[tenant] = left
        else:
            self.held.pop(tenant, None)


class _DiskTrouble:
    """Said once per executor process: its logs cannot be written (a full disk), then that they are again."""

    failing = False

    @classmethod
    def failed(cls, path: Path | str, exc: OSError) -> None:
        if not cls.failing:
            cls.failing = True
            why = "no space left on its disk" if exc.errno in NO_SPACE else (exc.strerror or str(exc))
            log.warning(
                "cannot write the output of jobs to %s (%s): what cannot be written is dropped, and each log says "
                "how much once it can be written again (said once until then)",
                path,
                why,
            )

    @classmethod
    def written(cls) -> None:
        if cls.failing:
            cls.failing = False
            log.warning("the output of jobs is written again")


def tail_lines(path: Path, lines: int = 20) -> list[str]:
    """The last `lines` lines of a log, across a rotation."""
    found: deque[str] = deque(maxlen=lines)
    for file in log_files(path)[-2:]:
        with file.open("r", errors="replace") as f:
            found.extend(line.rstrip("\n") for line in f)
    return list(found)


def output_after(path: Path, offset: int, most: int) -> tuple[int, bytes]:
    """A replica's output from byte `offset` on (counted from its first byte, across its rotated files), at
    most its last `most` bytes: (where what is returned begins, the bytes)."""
    files = log_files(path)
    sizes = [f.stat().st_size for f in files]
    total = sum(sizes)
    begin = max(offset, total - most)
    if begin >= total:
        return total, b""
    parts, position = [], total
    for file, size in zip(reversed(files), reversed(sizes), strict=True):
        position -= size
        if position + size <= begin:
            break
        with file.open("rb") as f:
            f.seek(max(begin - position, 0))
            parts.append(f.read(size - max(begin - position, 0)))
    return begin, b"".join(reversed(parts))


class RotatingLog:
    """Appends bytes to a log, rotating it at `max_bytes` (0: never). Unbuffered: readers on this node see
    every write. With a `shipper`, the same bytes also go to the log store under `key`, where the API reads
    them from any node. With a `budget`, the log's bytes count against `tenant`'s (`LogBudget`): output beyond
    it is dropped, after a line that says so. Writing never raises for a disk that refuses a write."""

    def __init__(
        self,
        path: Path | str,
        max_bytes: int,
        backups: int,
        *,
        shipper: LogShipper | None = None,
        key: LogKey | None = None,
        budget: LogBudget | None = None,
        tenant: str = "",
    ):
        if max_bytes < 0 or backups < 0:
            raise ValueError("log size and number of backups cannot be negative")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        try:
            self.fd = self._open()
        except FileNotFoundError:  # its folder is made only when missing (a stat and a mkdir saved per log)
            private_dir(os.path.dirname(path))
            self.fd = self._open()
        self.size = os.fstat(self.fd).st_size
        self.written = 0
        """Bytes written through this object (rotations included)."""
        self.shipped = (shipper, key) if shipper is not None and key is not None else None
        """Where the bytes also go (the shipper, under the key), when there is a shipper and a key."""
        # a log written before (an executor restarted while its replica ran) goes on at its whole size
        before = sum(os.path.getsize(f) for f in log_files(Path(path))) if self.size else 0
        if self.shipped is not None:
            self.shipped[0].open(self.shipped[1], before)
        self.budget = budget
        self.tenant = tenant
        self.held = before
        """Bytes of this log on disk, its rotated files included: what counts against its tenant's budget."""
        if budget is not None:
            budget.take(tenant, before)
        self.truncated = False
        """Its tenant's budget was reached: what it is given is dropped (`over_budget` bytes so far) until some
        of the budget is freed (`truncated_at`: the tenant's `LogBudget.freed` then)."""
        self.truncated_at = 0
        self.over_budget = 0
        self.lost = 0
        """Bytes the disk refused since the last write it took."""
        self.line_open = self.size > 0 and _last_byte(path) != NEWLINE
        """The file does not end with a whole line (a line of the platform's own begins with a newline)."""

    def write(self, data: bytes) -> None:
        """Append `data`; a file is rotated at a line's end where it can be (a longer line is split)."""
        view = memoryview(data)
        while view:
            if self.max_bytes and self.size >= self.max_bytes:
                self.rotate()
            room = self.max_bytes - self.size if self.max_bytes else len(view)
            if len(view) <= room:
                cut = len(view)
            else:
                cut = bytes(view[:room]).rfind(b"\n") + 1
                if cut == 0:
                    if self.size > 0:
                        self.rotate()
                        continue
                    cut = room
            allowed = self._budgeted(view[:cut])
            if allowed:
                self._put(view[:allowed])
                view = view[allowed:]
            if allowed < cut:  # the budget is reached: the rest is dropped, after a line that says so
                self._truncate()
                self.over_budget += len(view)
                return

    def _budgeted(self, chunk: memoryview) -> int:
        """How much of `chunk` the tenant's budget takes: all of it where it fits, else its whole lines that
        fit. Once truncated, nothing until some of the budget was freed (another replica of the tenant ended
        or rotated); then what fits, after a line that says how much was dropped."""
        if self.budget is None:
            return len(chunk)
        if self.truncated and self.budget.freed.get(self.tenant, 0) == self.truncated_at:
            return 0
        room = self.budget.room(self.tenant, len(chunk))
        allowed = room if room == len(chunk) else bytes(chunk[:room]).rfind(b"\n") + 1
        if allowed and self.truncated:
            dropped, self.over_budget, self.truncated = self.over_budget, 0, False
            self._put(
                self._note(
                    f"output resumes: {format_size(dropped)} dropped over the log budget of tenant "
                    f"{self.tenant!r}"
                )
            )
        return allowed

    def _truncate(self) -> None:
        """Say once that the budget is reached (what follows is dropped until some of it is freed)."""
        if self.truncated or self.budget is None:
            return
        self.truncated, self.truncated_at = True, self.budget.freed.get(self.tenant, 0)
        held = format_size(self.budget.held.get(self.tenant, 0))
        self._put(
            self._note(
                f"output truncated: the running jobs of tenant {self.tenant!r} hold {held} of log here, "
                f"their budget of {format_size(self.budget.limit)} ({BUDGET_SETTING}); what this replica "
                "prints is dropped until some of it is freed"
            )
        )

    def _note(self, text: str) -> bytes:
        """A line of the platform's own in the output, on a line of its own."""
        prefix = "\n" if self.line_open else ""
        return f"{prefix}{NOTE}{text}\n".encode()

    def _put(self, chunk: memoryview | bytes) -> None:
        """Ship `chunk` and write it to the file. What the disk refuses is dropped (`lost`), said once per
        process; the first write it takes again begins with a line saying how much is missing."""
        if self.shipped is not None:
            shipper, key = self.shipped
            if isinstance(chunk, memoryview) and type(obj := chunk.obj) is bytes and chunk.nbytes == len(obj):
                shipper.write(key, obj)  # the whole of a bytes object: no copy
            else:
                shipper.write(key, bytes(chunk))
        if self.lost:
            gap = self._note(f"{format_size(self.lost)} of output lost here: the disk refused it")
            if not self._write_file(memoryview(gap), counted=False):
                self.lost += len(chunk)
                return
            self.lost = 0
        self._write_file(memoryview(chunk), counted=True)

    def _write_file(self, chunk: memoryview, *, counted: bool) -> bool:
        """Write all of `chunk`; False (what was not written counted in `lost` when `counted`) if the disk
        refused it."""
        try:
            if self.fd < 0:  # (a rotation whose new file could not be made)
                self.fd = self._open()
                self.size = os.fstat(self.fd).st_size
            while chunk:
                n = _write(self.fd, chunk)
                self.size += n
                self.written += n
                self._held(n)
                if n:
                    self.line_open = chunk[n - 1] != NEWLINE
                chunk = chunk[n:]
        except OSError as exc:
            if counted:
                self.lost += len(chunk)
            _DiskTrouble.failed(self.path, exc)
            return False
        if _DiskTrouble.failing:
            _DiskTrouble.written()
        return True

    def _held(self, change: int) -> None:
        self.held += change
        if self.budget is not None:
            if change >= 0:
                self.budget.take(self.tenant, change)
            else:
                self.budget.give_back(self.tenant, -change)

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def rotate(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        path = Path(self.path)
        try:
            if self.backups == 0:
                self._held(-_unlink(path))
            else:
                self._held(-_unlink(backup_path(path, self.backups)))
                for n in range(self.backups - 1, 0, -1):
                    with contextlib.suppress(FileNotFoundError):
                        backup_path(path, n).rename(backup_path(path, n + 1))
                path.rename(backup_path(path, 1))
            self.fd = self._open()
        except OSError as exc:  # the next write tries to open it again
            _DiskTrouble.failed(self.path, exc)
        self.size = 0

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.shipped is not None:
            self.shipped[0].close(self.shipped[1])
        if self.budget is not None:
            self.budget.give_back(self.tenant, self.held)
            self.budget = None


def _last_byte(path: Path | str) -> int | None:
    try:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            last = f.read(1)
    except OSError:
        return None
    return last[0] if last else None


def _unlink(path: Path) -> int:
    """Delete a file; its size (0 if there was none)."""
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return 0
    return size


class LogPump:
    """Copies a replica's output pipe into its rotating log file.

    The pipe's read end is a plain reader of the event loop, closed right after it is unregistered (a pipe
    transport of uvloop closes its descriptor first and leaves it registered until a later turn of the loop:
    a new pipe given that number meanwhile could not be watched)."""

    def __init__(self, fd: int, sink: RotatingLog):
        self.fd = fd
        self.sink = sink
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future = self.loop.create_future()
        os.set_blocking(fd, False)
        self.loop.add_reader(fd, self._readable)

    def _readable(self) -> None:
        try:
            data = os.read(self.fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            log.warning("cannot read the output of %s: %s", self.sink.path, exc)
            data = b""
        if not data:  # every writer has closed it: the replica and whatever it started are gone
            self.close()
            return
        try:
            self.sink.write(data)
        except OSError as exc:  # a full disk must not take the executor down; the job goes on
            log.warning("cannot write log %s: %s", self.sink.path, exc)

    def close(self) -> None:
        if self.fd >= 0:
            self.loop.remove_reader(self.fd)
            os.close(self.fd)
            self.fd = -1
        if not self.done.done():
            self.done.set_result(None)
