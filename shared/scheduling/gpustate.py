"""Interned GPU states of nodes: (GPU model, free milli-GPU of each GPU, sorted) -> a small integer id.

Thousands of nodes share a handful of states (all empty 8-GPU G2 nodes look alike), so anything that depends
only on a node's GPU state (its fragmentation, the state after placing a shape) is computed once per state and
looked up with numpy fancy indexing. Ids never change for the life of the process; they carry no order that
matters to a decision (every choice breaks ties by node position).
"""

from __future__ import annotations

import numpy as np

from gpuyard.shared.scheduling.demand import MILLI


class GpuStateTable:
    def __init__(self) -> None:
        self._ids: dict[tuple[int, tuple[int, ...]], int] = {}
        self.states: list[tuple[int, tuple[int, ...]]] = []
        self.model_names: list[str] = []
        self._model_ids: dict[str, int] = {}
        self._cap = 256
        self.total_free = np.zeros(self._cap, dtype=np.int64)
        self.model = np.zeros(self._cap, dtype=np.int32)
        self.width = 1  # most GPUs on one node seen so far
        self._after_whole: dict[int, np.ndarray] = {}
        self._after_share: dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.states)

    def model_id(self, name: str) -> int:
        found = self._model_ids.get(name)
        if found is None:
            found = self._model_ids[name] = len(self.model_names)
            self.model_names.append(name)
        return found

    def intern(self, model: int, free: tuple[int, ...]) -> int:
        """`free` must be sorted, largest first."""
        key = (model, free)
        found = self._ids.get(key)
        if found is not None:
            return found
        sid = len(self.states)
        if sid >= self._cap:
            self._grow()
        self._ids[key] = sid
        self.states.append(key)
        self.total_free[sid] = sum(free)
        self.model[sid] = model
        if len(free) > self.width:
            self.width = len(free)
            self._after_share.clear()
        return sid

    def _grow(self) -> None:
        self._cap *= 2
        self.total_free = np.resize(self.total_free, self._cap)
        self.model = np.resize(self.model, self._cap)

    def _table(self, tables: dict[int, np.ndarray], key: int, width: int) -> np.ndarray:
        table = tables.get(key)
        if table is None or table.shape[0] < self._cap:
            grown = np.full((self._cap, width), -2, dtype=np.int64)
            if table is not None:
                grown[: table.shape[0]] = table
            table = tables[key] = grown
        return table

    def after_whole(self, sids: np.ndarray, count: int) -> np.ndarray:
        """State ids after taking `count` idle GPUs from each state (-1 where there are not enough), shape (n, 1)."""
        table = self._table(self._after_whole, count, 1)
        out = table[sids]
        missing = np.flatnonzero(out[:, 0] == -2)
        if missing.size:
            for sid in np.unique(sids[missing]).tolist():
                table[sid, 0] = self._take_whole(sid, count)
            out = table[sids]
        return out

    def after_share(self, sids: np.ndarray, milli: int) -> np.ndarray:
        """For each state, the states reachable by putting a `milli` share on one GPU, one column per distinct
        free value (largest free first, see `share_options`), -1 padding. Shape (n, width)."""
        table = self._table(self._after_share, milli, self.width)
        out = table[sids]
        missing = np.flatnonzero(out[:, 0] == -2)
        if missing.size:
            for sid in np.unique(sids[missing]).tolist():
                row = table[sid]
                row[:] = -1
                for j, value in enumerate(self.share_options(sid, milli)):
                    row[j] = self._take_share(sid, value, milli)
            out = table[sids]
        return out

    def share_options(self, sid: int, milli: int) -> list[int]:
        """Distinct free values (largest first) of the state's GPUs that can hold a `milli` share."""
        options: list[int] = []
        for value in self.states[sid][1]:
            if value >= milli and (not options or options[-1] != value):
                options.append(value)
        return options

    def _take_whole(self, sid: int, count: int) -> int:
        model, free = self.states[sid]
        idle = sum(1 for v in free if v == MILLI)
        if idle < count:
            return -1
        rest = free[count:] + (0,) * count  # the idle GPUs are the first ones (sorted largest first)
        return self.intern(model, tuple(sorted(rest, reverse=True)))

    def _take_share(self, sid: int, value: int, milli: int) -> int:
        model, free = self.states[sid]
        at = free.index(value)
        rest = list(free)
        rest[at] = value - milli
        return self.intern(model, tuple(sorted(rest, reverse=True)))


STATES = GpuStateTable()  # shared by every index in the process (a memo, not scheduling state)
