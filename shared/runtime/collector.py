"""How a service's Python collects cyclic garbage.

The default thresholds (700 allocations, then every 10th and 100th collection) suit short scripts. A service
holds tens of thousands of live objects (a queue of jobs, their views, pydantic models, the bus's buffers) and
allocates and frees many more per job, so the collector runs hundreds of times a second, and its older
generations walk every live object again and again: 15 % of the scheduler's CPU and 5 % of an executor's under
the pipeline benchmark (perf). Almost nothing a service frees is cyclic (reference counting frees it), so
collecting 50 times less often costs a few MB of pending garbage at most; with 20,000 jobs queued it took the
scheduler's CPU per job from 1.51 to 1.19 ms and an executor's from 2.91 to 2.54 (docs/benchmarks.md).

`collect_less()` runs once a service has started: what was made by then (modules, settings, schemas,
connections) lives as long as the process and is frozen out of every later collection (`gc.freeze`). A
service whose every request waits on it (serving: an inference's latency) keeps Python's thresholds: a
collection of the youngest generation at 35,000 objects pauses it about 1 ms, against 0.07 ms at 700.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 35_000
"""Net allocations of container objects between two collections of the youngest generation (default 700)."""
OLDER_THRESHOLDS = (20, 20)
"""Collections of the generation below between two of the next (default 10, 10; the oldest also waits until
a quarter of what it holds is new, as CPython always does)."""


def collect_less(*, pauses_matter: bool = False) -> None:
    gc.collect()
    gc.freeze()
    if not pauses_matter:
        gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
