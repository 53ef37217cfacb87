"""Dynamic batching for one model: concurrent requests whose inputs agree on names, dtypes and every
dimension but the first are stacked along the first dimension into one `session.run`, and the outputs are
split back. Requests of other shapes wait for a batch of their own; they are never mixed.

A batch leaves when it holds `max_batch_size` rows, or `max_queue_delay_us` after its first request arrived
(0: as soon as the previous run is over, with whatever is queued by then). One batch runs at a time, in a
thread, so the event loop stays free. Batching is off for `max_batch_size` 0 or 1 and for a model whose first
dimension is fixed: each request then runs on its own, as many at once as threads come."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from services.serving.errors import BadRequest, ServingError, Unavailable
from services.serving.runtime import OnnxModel


@dataclass(slots=True, eq=False)
class _Queued:
    key: tuple
    feeds: dict[str, np.ndarray]
    rows: int
    outputs: list[str]
    future: asyncio.Future
    arrived: float


class Batcher:
    def __init__(
        self,
        model: OnnxModel,
        max_batch_size: int = 0,
        max_queue_delay_us: int = 0,
        executor: Executor | None = None,
    ):
        self.model = model
        self.max_batch_size = max_batch_size
        self.max_queue_delay = max_queue_delay_us / 1e6
        self.executor = executor
        self.enabled = max_batch_size > 1 and model.batchable
        self.batches = 0
        """Runs made for queued requests (each one `session.run`)."""
        self.batched_requests = 0
        self._queue: deque[_Queued] = deque()
        self._arrival = asyncio.Event()
        self._worker: asyncio.Task | None = None
        self._closing = False

    async def infer(self, feeds: dict[str, np.ndarray], outputs: list[str]) -> dict[str, np.ndarray]:
        """The model's `outputs` for one request's `feeds` (already checked against the model's inputs)."""
        if self._closing:
            raise Unavailable("the model is being unloaded")
        loop = asyncio.get_running_loop()
        if not self.enabled:
            return await loop.run_in_executor(self.executor, self.model.run, feeds, outputs)
        rows = {array.shape[0] for array in feeds.values()}
        if len(rows) > 1:
            raise BadRequest(f"the inputs disagree on the batch dimension: {sorted(rows)}")
        count = rows.pop()
        if not 0 < count <= self.max_batch_size:  # too large for any batch: on its own
            return await loop.run_in_executor(self.executor, self.model.run, feeds, outputs)
        key = tuple((name, array.dtype.str, array.shape[1:]) for name, array in sorted(feeds.items()))
        queued = _Queued(key, feeds, count, outputs, loop.create_future(), loop.time())
        self._queue.append(queued)
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name="batcher")
        self._arrival.set()
        return await queued.future

    def close(self) -> None:
        """Take no more requests; those queued still run."""
        self._closing = True
        self._arrival.set()

    async def aclose(self) -> None:
        """Close, and wait until the queued requests have been answered."""
        self.close()
        if self._worker is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queue or not self._closing:
            if not self._queue:
                self._arrival.clear()
                await self._arrival.wait()
                continue
            first = self._queue[0]
            deadline = first.arrived + self.max_queue_delay
            while self._rows(first.key) < self.max_batch_size and not self._closing:
                left = deadline - loop.time()
                if left <= 0:
                    break
                self._arrival.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._arrival.wait(), left)
            batch = self._take(first.key)
            if batch:
                await self._run(loop, batch)

    def _rows(self, key: tuple) -> int:
        return sum(q.rows for q in self._queue if q.key == key and not q.future.done())

    def _take(self, key: tuple) -> list[_Queued]:
        """The oldest queued requests of `key` that fit in one batch; the others stay queued, in order."""
        batch, kept, rows = [], deque(), 0
        for queued in self._queue:
            if queued.future.done():  # its caller went away
                continue
            if queued.key == key and rows + queued.rows <= self.max_batch_size:
                batch.append(queued)
                rows += queued.rows
            else:
                kept.append(queued)
        self._queue = kept
        return batch

    async def _run(self, loop: asyncio.AbstractEventLoop, batch: list[_Queued]) -> None:
        names = list(dict.fromkeys(name for queued in batch for name in queued.outputs))
        try:
            if len(batch) == 1:
                feeds = batch[0].feeds
            else:
                feeds = {name: np.concatenate([q.feeds[name] for q in batch]) for name in batch[0].feeds}
            self.batches += 1
            self.batched_requests += len(batch)
            results = await loop.run_in_executor(self.executor, self.model.run, feeds, names)
            total = sum(q.rows for q in batch)
            for name, array in results.items():
                if array.shape[:1] != (total,):
                    raise ServingError(
                        f"output '{name}' has shape {list(array.shape)} for a batch of {total}: "
                        "the model cannot be batched"
                    )
        except Exception as exc:
            for queued in batch:
                if not queued.future.done():
                    queued.future.set_exception(exc)
            return
        start = 0
        for queued in batch:
            end = start + queued.rows
            if not queued.future.done():
                queued.future.set_result({name: results[name][start:end] for name in queued.outputs})
            start = end
