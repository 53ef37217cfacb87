"""Expected GPU fragmentation of a node, as defined by FGD (Weng et al., USENIX ATC 2023).

For a node and a task shape m: if m cannot run on the node (GPU model, CPUs, or not enough GPUs with room),
ALL of the node's free GPU capacity is fragment for m; if it can run, only the free capacity on GPUs too small
for m's per-GPU share is. The node's fragmentation is the popularity-weighted sum over the typical shapes (the
most frequent shapes covering 95% of tasks), in milli-GPU.

It depends on the node only through (GPU state id, free CPUs), and on free CPUs only through how many shapes'
CPU requests fit. So per GPU state we keep one row R: R[level] = sum over the `level` smallest-CPU shapes that
fit the GPUs of p(m) * (free - fragment(m)); then fragmentation = free * sum(p) - R[level(free CPUs)], computed
for thousands of candidate nodes at once with fancy indexing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from gpuyard.shared.scheduling.demand import MILLI, Demand
from gpuyard.shared.scheduling.gpustate import STATES, GpuStateTable

POPULARITY_COVERAGE = 0.95  # FGD's artifact: typical shapes = most frequent ones covering 95% of tasks


@dataclass(frozen=True, slots=True)
class TaskShape:
    cpus: float
    milli: int  # per GPU
    count: int  # GPUs (0 = CPU only)
    models: tuple[str, ...] = ()


def shape_of(demand: Demand) -> TaskShape:
    return TaskShape(demand.cpus, demand.milli, demand.count, demand.models)


def typical_shapes(shapes: Iterable[TaskShape] | Counter, coverage: float = POPULARITY_COVERAGE) -> tuple:
    """((shape, weight), ...) for the most frequent shapes covering `coverage` of the tasks, weights sum to 1.

    `shapes`: one shape per task, or a Counter of them."""
    counts = shapes if isinstance(shapes, Counter) else Counter(shapes)
    total = sum(counts.values())
    if not total:
        return ()
    ranked = sorted(
        counts.items(), key=lambda kv: (-kv[1], kv[0].count, kv[0].milli, kv[0].cpus, kv[0].models)
    )
    kept, covered = [], 0
    for shape, n in ranked:
        kept.append((shape, n))
        covered += n
        if covered >= coverage * total:
            break
    return tuple((shape, n / covered) for shape, n in kept)


class Fragmenter:
    """Fragmentation rows for one shape distribution (cached per distribution, see `fragmenter_for`)."""

    def __init__(self, popularity: tuple, states: GpuStateTable = STATES) -> None:
        self.states = states
        shapes = [s for s, _ in popularity]
        order = sorted(range(len(shapes)), key=lambda k: shapes[k].cpus)
        self.shapes = [shapes[k] for k in order]
        self.weights = np.array([popularity[k][1] for k in order], dtype=np.float64)
        self.total_weight = float(self.weights.sum())
        self.cpu_sorted = np.array([s.cpus for s in self.shapes], dtype=np.float64)
        self.milli = np.array([s.milli for s in self.shapes], dtype=np.int64)
        self.count = np.array([s.count for s in self.shapes], dtype=np.int64)
        gpu = self.count > 0
        gpus = float((self.weights[gpu] * self.count[gpu] * self.milli[gpu]).sum()) / MILLI
        # CPUs the typical task asks for per GPU it uses (popularity-weighted); 0 = no GPU shapes
        self.cpus_per_gpu = float((self.weights[gpu] * self.cpu_sorted[gpu]).sum()) / gpus if gpus else 0.0
        self._access: list[np.ndarray] = []  # per model id: which shapes may run on that model
        self.rows = np.zeros((256, len(self.shapes) + 1), dtype=np.float64)
        self.ready = np.zeros(256, dtype=bool)

    def _access_for(self, model: int) -> np.ndarray:
        while len(self._access) <= model:
            name = self.states.model_names[len(self._access)]
            self._access.append(
                np.array([(not s.models or name in s.models) for s in self.shapes], dtype=bool)
            )
        return self._access[model]

    def _ensure(self, sids: np.ndarray) -> None:
        top = int(sids.max()) if sids.size else -1
        if top >= self.rows.shape[0]:
            size = max(top + 1, 2 * self.rows.shape[0])
            rows = np.zeros((size, self.rows.shape[1]), dtype=np.float64)
            rows[: self.rows.shape[0]] = self.rows
            ready = np.zeros(size, dtype=bool)
            ready[: self.ready.shape[0]] = self.ready
            self.rows, self.ready = rows, ready
        todo = sids[~self.ready[sids]]
        if todo.size:
            for sid in np.unique(todo).tolist():
                self.rows[sid] = self._row(sid)
                self.ready[sid] = True

    def _row(self, sid: int) -> np.ndarray:
        model, free = self.states.states[sid]
        row = np.zeros(len(self.shapes) + 1, dtype=np.float64)
        if not free or not self.shapes:
            return row
        gpus = np.asarray(free, dtype=np.int64)
        total = int(gpus.sum())
        roomy = gpus[None, :] >= self.milli[:, None]
        runs = (roomy.sum(axis=1) >= self.count) & (self.count > 0)
        if model >= 0:
            runs &= self._access_for(model)
        else:
            runs &= np.array([not s.models for s in self.shapes], dtype=bool)
        fragment = np.where(roomy, 0, gpus[None, :]).sum(axis=1)
        usable = np.where(runs, self.weights * (total - fragment), 0.0)
        row[1:] = np.cumsum(usable)
        return row

    def levels(self, cpu_free: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.cpu_sorted, cpu_free + 1e-9, side="right")

    def fragmentation(self, sids: np.ndarray, cpu_free: np.ndarray) -> np.ndarray:
        """Fragmentation (milli-GPU) of nodes in these GPU states with these free CPUs; same shapes in and out."""
        flat = sids.reshape(-1)
        self._ensure(flat[flat >= 0])
        safe = np.where(sids >= 0, sids, 0)
        level = self.levels(cpu_free)
        value = self.states.total_free[safe] * self.total_weight - self.rows[safe, level]
        return np.where(sids >= 0, value, np.inf)

    def after_states(self, sids: np.ndarray, demand: Demand) -> np.ndarray:
        """GPU states after placing one replica, shape (n, options); -1 where an option does not exist."""
        if not demand.count:
            return sids[:, None]
        if demand.milli == MILLI:
            return self.states.after_whole(sids, demand.count)
        return self.states.after_share(sids, demand.milli)

    def deltas(self, sids: np.ndarray, cpu_free: np.ndarray, demand: Demand) -> np.ndarray:
        """Growth of fragmentation for placing the replica on each node, per option: shape (n, options)."""
        after = self.after_states(sids, demand)
        now = self.fragmentation(sids, cpu_free)
        later = self.fragmentation(after, np.broadcast_to((cpu_free - demand.cpus)[:, None], after.shape))
        return later - now[:, None]


_CACHE: dict[tuple, Fragmenter] = {}


def fragmenter_for(popularity: tuple) -> Fragmenter:
    found = _CACHE.get(popularity)
    if found is None:
        if len(_CACHE) > 32:
            _CACHE.clear()
        found = _CACHE[popularity] = Fragmenter(popularity)
    return found
