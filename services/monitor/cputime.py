"""CPU use of process trees, read from /proc: what a simulated GPU reports as its utilization.

A replica's processes are one session (its reaper starts its first process with `setsid`, so the session id
is that process's pid): the CPU time of a replica is the user and system time of every live process of its
session, with the time of the children they waited for (`cutime`, `cstime`), so that a short-lived child's
work is not lost when it ends. One pass over /proc reads every session asked for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

TICKS = os.sysconf("SC_CLK_TCK")


def session_cpu_seconds(sessions: set[int], proc: str = "/proc") -> dict[int, float]:
    """Session id -> CPU seconds of its live processes so far (0.0 for a session with none)."""
    totals = dict.fromkeys(sessions, 0.0)
    if not sessions:
        return totals
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:  # ended meanwhile, or not ours to read
            continue
        fields = data[data.rindex(b")") + 2 :].split()  # (the command, in parentheses, may hold spaces)
        try:
            sid = int(fields[3])  # field 6 of /proc/PID/stat
            if sid in totals:  # fields 14-17: utime, stime, cutime, cstime
                totals[sid] += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / TICKS
        except (IndexError, ValueError):
            continue
    return totals


class CpuUse:
    """Each session's CPU use between two calls, in percent of one core (100: one core busy all the time)."""

    def __init__(
        self,
        *,
        read: Callable[[set[int]], dict[int, float]] = session_cpu_seconds,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.read = read
        self.clock = clock
        self.last: dict[int, tuple[float, float]] = {}  # session -> (when, CPU seconds then)

    def percent(self, sessions: set[int]) -> dict[int, float]:
        """Session -> CPU % since the previous call that asked for it (0.0 the first time)."""
        now = self.clock()
        seconds = self.read(sessions)
        use = {}
        for sid in sessions:
            then = self.last.get(sid)
            spent = seconds.get(sid, 0.0)
            if then is None or now <= then[0]:
                use[sid] = 0.0
            else:
                use[sid] = max(0.0, (spent - then[1]) / (now - then[0]) * 100)  # (< 0: a process ended)
            self.last[sid] = (now, spent)
        for sid in set(self.last) - sessions:
            del self.last[sid]
        return use
