"""Dynamic batching for one model: concurrent requests whose inputs agree on names, dtypes and every
dimension but the first are stacked along the first dimension into one `session.run`, and the outputs are
split back (views of the batch's outputs, not copies). Requests of other shapes wait for a batch of their own;
they are never mixed.

A batch leaves when it holds `max_batch_size` rows, or `max_queue_delay_us` after its first request arrived.
With a delay of 0 it leaves at the end of the event loop's current iteration, holding every request that
arrived in it, or, while a run is going on, when that run ends, with whatever is queued by then. One batch runs
at a time. Batching is off for `max_batch_size` 0 or 1 and for a model whose first dimension is fixed: each
request then runs on its own, as many at once as threads come.

Where a run goes: a thread hop costs more than a small model's whole run (about 25 µs of CPU against 11 µs for
an MLP 784-256-10), so a run expected to take at most `inline_run_us` runs on the event loop itself, and any
other in a thread, so the loop stays free. What a run is expected to take is learnt from the runs made: per
size of its inputs (rounded up to a power of two), the recent time of a run, falling at once to a faster run
and rising an eighth of the way to a slower one; a size never run yet runs in a thread. The time of a run on
the loop is its wall time (what it blocks the loop). The time of a run in a thread is the CPU time of that
thread when the session computes in the caller's thread alone (the CPU provider, one intra-op thread): its
wall time also counts the wait for the GIL, which on a busy machine would keep every run in threads. Else
(a GPU, several intra-op threads) it is wall time, since the caller also waits for the others."""

from __future__ import annotations

import asyncio
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from functools import partial
from time import perf_counter, thread_time

import numpy as np

from gpuyard.services.serving.errors import BadRequest, ServingError, Unavailable
from gpuyard.services.serving.runtime import CPU, OnnxModel

INLINE_RUN_US = 100
"""A run expected to take at most this long runs on the event loop rather than in a thread: about as long as
the loop already spends decoding one JSON request of 784 floats."""


@dataclass(slots=True, eq=False)
class _Queued:
    feeds: dict[str, np.ndarray]
    rows: int
    outputs: list[str]
    future: asyncio.Future
    arrived: float


class RunTimes:
    """What a run is expected to take, learnt from the runs made: per size class (the inputs' elements,
    rounded up to a power of two), the recent time of a run (which clock: `Batcher`). A run is assumed no
    faster than a run of fewer elements, so a size class never run yet is expected to take what the next
    larger one known does (None: none known)."""

    def __init__(self) -> None:
        self._seconds: dict[int, float] = {}

    @staticmethod
    def size_class(feeds: dict[str, np.ndarray]) -> int:
        return 1 << (sum(array.size for array in feeds.values()) - 1).bit_length()

    def expected(self, size_class: int) -> float | None:
        took = self._seconds.get(size_class)
        if took is None:
            larger = [c for c in self._seconds if c > size_class]
            took = self._seconds[min(larger)] if larger else None
        return took

    def record(self, size_class: int, seconds: float) -> None:
        """Falls at once to a faster run; rises an eighth of the way to a slower one (one run slowed by
        the rest of the machine does not send every later run to a thread)."""
        old = self._seconds.get(size_class)
        self._seconds[size_class] = seconds if old is None or seconds < old else old + (seconds - old) / 8


class Batcher:
    def __init__(
        self,
        model: OnnxModel,
        max_batch_size: int = 0,
        max_queue_delay_us: int = 0,
        executor: Executor | None = None,
        inline_run_us: float = INLINE_RUN_US,
    ):
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_queue_delay = max_queue_delay_us / 1e6
        self.executor = executor
        self.inline_run = inline_run_us / 1e6
        self.enabled = max_batch_size > 1 and model.batchable
        self.times = RunTimes()
        computes_in_caller = model.provider == CPU and model.intra_op_threads == 1
        self._thread_clock = thread_time if computes_in_caller else perf_counter
        self.batches = 0
        """Runs made for queued requests (each one `session.run`)."""
        self.batched_requests = 0
        self.inline_runs = 0
        """Runs made on the event loop (batches and requests on their own)."""
        self._queues: dict[tuple, deque[_Queued]] = {}
        """Per key (each input's name, dtype and shape but the first dimension), its requests in order."""
        self._rows: dict[tuple, int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._look_handle: asyncio.Handle | None = None
        self._look_timed = False
        """Whether the pending look is the first request's delay running out (else: the loop's next
        iteration)."""
        self._running = False
        """A batch runs in a thread."""
        self._drained: asyncio.Future | None = None
        self._closing = False

    async def infer(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """The model's `outputs` for one request's `feeds` (already checked against the model's inputs)."""
        if self._closing:
            raise Unavailable("the model is being unloaded")
        if not self.enabled:
            return await self._alone(feeds, outputs)
        rows = {array.shape[0] for array in feeds.values()}
        if len(rows) > 1:
            raise BadRequest(f"the inputs disagree on the batch dimension: {sorted(rows)}")
        count = rows.pop()
        if not 0 < count <= self.max_batch_size:  # too large for any batch: on its own
            return await self._alone(feeds, outputs)
        key = tuple((name, array.dtype.str, array.shape[1:]) for name, array in feeds.items())
        loop = self._loop = asyncio.get_running_loop()
        queued = _Queued(feeds, count, outputs, loop.create_future(), loop.time())
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            self._rows[key] = 0
        queue.append(queued)
        self._rows[key] += count
        if not self._running:
            if self._look_handle is None:
                self._look_handle = loop.call_soon(self._look)
            elif self._look_timed and self._rows[key] >= self.max_batch_size:
                self._look_soon()
        return await queued.future

    def close(self) -> None:
        """Take no more requests; those queued still run, without waiting out the delay."""
        self._closing = True
        if self._look_timed:
            self._look_soon()

    async def aclose(self) -> None:
        """Close, and wait until the queued requests have been answered."""
        self.close()
        if self._queues or self._running:
            if self._drained is None:
                self._drained = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._drained)

    # --- a request on its own ------------------------------------------------------------------------------

    async def _alone(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        size = RunTimes.size_class(feeds)
        if self._inline(size):
            self.inline_runs += 1
            return self._timed_run(feeds, outputs, size)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self.executor, self._timed_run, feeds, outputs, size, self._thread_clock
        )

    def _inline(self, size: int) -> bool:
        expected = self.times.expected(size)
        return expected is not None and expected <= self.inline_run

    def _timed_run(
        self, feeds: dict[str, np.ndarray], outputs: list[str], size: int, clock=perf_counter
    ) -> dict[str, np.ndarray]:
        started = clock()
        try:
            return self.model.run(feeds, outputs)
        finally:
            self.times.record(size, clock() - started)

    # --- the queue ----------------------------------------------------------------------------------------

    def _look_soon(self) -> None:
        if self._look_handle is not None:
            self._look_handle.cancel()
        self._look_timed = False
        self._look_handle = self._loop.call_soon(self._look) if self._loop is not None else None

    def _look(self) -> None:
        """Send the oldest request's batch when it is full, its delay is over or the batcher closes; else
        look again when the delay is over."""
        self._look_handle = None
        self._look_timed = False
        if self._running:
            return  # the run's end looks again
        key, loop = self._oldest(), self._loop
        if key is None or loop is None:  # (nothing queued: `infer` sets the loop as it queues)
            if self._drained is not None and not self._drained.done():
                self._drained.set_result(None)
            return
        if not self._closing and self._rows[key] < self.max_batch_size:
            wait = self._queues[key][0].arrived + self.max_queue_delay - loop.time()
            if wait > 0:
                self._look_handle = loop.call_later(wait, self._look)
                self._look_timed = True
                return
        self._send(self._take(key), loop)

    def _oldest(self) -> tuple | None:
        """The key of the request that has waited longest (callers that went away dropped first)."""
        oldest, arrived = None, 0.0
        for key, queue in list(self._queues.items()):
            while queue and queue[0].future.done():
                self._rows[key] -= queue.popleft().rows
            if not queue:
                del self._queues[key], self._rows[key]
            elif oldest is None or queue[0].arrived < arrived:
                oldest, arrived = key, queue[0].arrived
        return oldest

    def _take(self, key: tuple) -> list[_Queued]:
        """The oldest queued requests of `key` that fit in one batch; the others stay queued, in order."""
        queue = self._queues[key]
        batch, skipped, rows = [], [], 0
        while queue and rows < self.max_batch_size:
            queued = queue.popleft()
            self._rows[key] -= queued.rows
            if queued.future.done():  # its caller went away
                continue
            if rows + queued.rows <= self.max_batch_size:
                batch.append(queued)
                rows += queued.rows
            else:
                skipped.append(queued)
        for queued in reversed(skipped):
            queue.appendleft(queued)
            self._rows[key] += queued.rows
        if not queue:
            del self._queues[key], self._rows[key]
        return batch

    # --- a batch ------------------------------------------------------------------------------------------

    def _send(self, batch: list[_Queued], loop: asyncio.AbstractEventLoop) -> None:
        """Run `batch`: on the loop when it is expected to be short (then look at the queue again in the
        loop's next iteration), else in a thread (looking again when it ends)."""
        names = list(dict.fromkeys(name for queued in batch for name in queued.outputs))
        try:
            if len(batch) == 1:
                feeds = batch[0].feeds
            else:
                feeds = {name: np.concatenate([q.feeds[name] for q in batch]) for name in batch[0].feeds}
        except Exception as exc:
            self._fail(batch, exc)
            self._look_soon()
            return
        self.batches += 1
        self.batched_requests += len(batch)
        size = RunTimes.size_class(feeds)
        if self._inline(size):
            self.inline_runs += 1
            try:
                results = self._timed_run(feeds, names, size)
            except Exception as exc:
                self._fail(batch, exc)
            else:
                self._answer(batch, results)
            if self._queues:
                self._look_soon()
            elif self._drained is not None and not self._drained.done():
                self._drained.set_result(None)
            return
        self._running = True
        running = loop.run_in_executor(self.executor, self._timed_run, feeds, names, size, self._thread_clock)
        running.add_done_callback(partial(self._ran, batch))

    def _ran(self, batch: list[_Queued], running: asyncio.Future) -> None:
        self._running = False
        if running.cancelled():
            self._fail(batch, Unavailable("the model's run was cancelled"))
        elif (exc := running.exception()) is not None:
            self._fail(batch, exc)
        else:
            self._answer(batch, running.result())
        self._look()

    def _answer(self, batch: list[_Queued], results: dict[str, np.ndarray]) -> None:
        total = sum(queued.rows for queued in batch)
        for name, array in results.items():
            if array.shape[:1] != (total,):
                self._fail(
                    batch,
                    ServingError(
                        f"output '{name}' has shape {list(array.shape)} for a batch of {total}: "
                        "the model cannot be batched"
                    ),
                )
                return
        start = 0
        for queued in batch:
            end = start + queued.rows
            if not queued.future.done():
                queued.future.set_result({name: results[name][start:end] for name in queued.outputs})
            start = end

    @staticmethod
    def _fail(batch: list[_Queued], exc: BaseException) -> None:
        for queued in batch:
            if not queued.future.done():
                queued.future.set_exception(exc)
