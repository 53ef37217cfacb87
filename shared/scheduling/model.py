"""Plain data of the scheduling core. Slotted dataclasses: the core must place thousands of jobs a second.

What the caller fills in (the live service or the trace simulator):

- `ClusterState.nodes`: every node with its GPUs, with the current allocations ALREADY applied
  (`Gpu.allocated` is the share in use 0..1, `Gpu.allocated_memory` the bytes of memory slices handed out,
  `Node.allocated_cpus` / `Node.allocated_memory` likewise).
- `ClusterState.running`: the jobs that hold resources now, with `started_at` (for preemption's minimum runtime
  and for start estimates together with `JobRequest.timeout`) and `checkpointed_at` (the latest checkpoint of the
  current attempt, if any: preemption prefers the victims that lose the least work).
- `ClusterState.quotas`: tenant -> guaranteed GPUs (a float). An empty dict switches quotas off (one shared
  pool, priority preemption only). With quotas set, a tenant may always get its guarantee back; usage above it
  is "borrowed" from idle capacity and is the first thing preempted when an owner reclaims. Tenants not listed
  are guaranteed 0 GPUs (everything they run is borrowed).
- `ClusterState.now`: the caller's clock in seconds (the core never reads a clock).
- `Node.schedulable` False (a cordoned node) and `Gpu.usable` False (an unhealthy or cordoned GPU): nothing
  new is placed there; what runs there is still counted as allocated (and may be preempted as elsewhere).

GPU shares are tracked in thousandths of a GPU (milli-GPU); a request is rounded UP to the next thousandth, so
three jobs of 1/3 GPU fit on one GPU and nothing is ever over-allocated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuyard.shared.contracts.policies import BackfillMode, Policy
from gpuyard.shared.contracts.stops import PreemptionCause
from gpuyard.shared.scheduling.reasons import Reason

EPS = 1e-9
ANY_PYTHON = "*"
"""`JobRequest.python` of an environment that names no version: any node that builds environments."""


@dataclass(slots=True)
class Gpu:
    index: int
    model: str
    memory: int  # bytes
    uuid: str = ""
    allocated: float = 0.0  # share of the GPU in use, 0..1
    allocated_memory: int = 0  # bytes of memory slices handed out
    usable: bool = True  # False: unhealthy or cordoned; nothing new is placed on it (what runs there stays)

    @property
    def free(self) -> float:
        return max(0.0, 1.0 - self.allocated)

    @property
    def idle(self) -> bool:
        return self.allocated <= EPS


@dataclass(slots=True)
class Node:
    name: str
    gpus: list[Gpu]
    cpus: float
    memory: int
    allocated_cpus: float = 0.0
    allocated_memory: int = 0
    schedulable: bool = True  # False: cordoned or drained; nothing new is placed on it
    pythons: frozenset[str] = frozenset()  # the Python versions it builds job environments for ("3.11")

    @property
    def idle_gpus(self) -> int:
        return sum(1 for g in self.gpus if g.idle)


# Equal job keys are one tuple (a dictionary look-up then matches a job's key by identity, without comparing
# the fields); a memo, cleared when full (later jobs then make new tuples, equal to the earlier ones).
_KEYS: dict[tuple, tuple] = {}
_MAX_KEYS = 10_000


@dataclass(frozen=True, slots=True)
class JobRequest:
    """A waiting (or running) job as the core sees it. Resources are per replica."""

    job_id: str
    tenant: str
    gpus: float = 0.0  # whole number >= 1, or a fraction 0 < g < 1, per replica
    replicas: int = 1
    cpus: float = 0.0
    memory: int = 0
    gpu_memory: int | None = None  # memory slice of a fractional GPU, or least memory per whole GPU
    gpu_models: tuple[str, ...] = ()
    priority: int = 50
    user: str = ""
    submitted_at: float = 0.0  # seconds, on the caller's clock
    timeout: float | None = None  # seconds an attempt may run (start estimates, backfill, reservations)
    not_before: float | None = None  # retry backoff: not placeable before this time
    # the Python version its environment is built for ("3.11"; ANY_PYTHON: the node's default; "": no
    # environment of its own): only nodes that offer it can hold the job
    python: str = ""
    # what a cycle tells jobs apart by: (gpus, replicas, cpus, memory, gpu_memory or 0, gpu_models as a tuple,
    # priority, and python when it has one); jobs with the same key get the same answer. Made once here: a
    # cycle reads it for every job.
    key: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        key: tuple = (
            self.gpus,
            self.replicas,
            self.cpus,
            self.memory,
            self.gpu_memory or 0,
            tuple(self.gpu_models),
            self.priority,
        )
        if self.python:  # (only then: a longer key hashes slower, in every dict of a cycle)
            key += (self.python,)
        if len(_KEYS) >= _MAX_KEYS:
            _KEYS.clear()
        object.__setattr__(self, "key", _KEYS.setdefault(key, key))

    @property
    def total_gpus(self) -> float:
        return self.gpus * self.replicas


@dataclass(frozen=True, slots=True)
class GpuAssignment:
    index: int
    fraction: float = 1.0
    memory: int | None = None


@dataclass(frozen=True, slots=True)
class ReplicaAssignment:
    replica: int
    node: str
    gpus: tuple[GpuAssignment, ...]
    cpus: float = 0.0
    memory: int = 0


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: str
    replicas: tuple[ReplicaAssignment, ...]
    borrowed: bool = False  # admitted above the tenant's guarantee (first to go when the owner reclaims)


@dataclass(frozen=True, slots=True)
class Allocation:
    """A job that holds resources now (placed or running)."""

    job: JobRequest
    replicas: tuple[ReplicaAssignment, ...]
    started_at: float = 0.0
    borrowed: bool = False  # admitted on another tenant's idle quota
    # when the latest checkpoint of the current attempt was saved (None: none): the work a preemption loses
    # began at the later of this and `started_at` (`preemption.lost_work`)
    checkpointed_at: float | None = None


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: str
    reason: PreemptionCause  # priority (a higher-priority job needs the room) or reclaim (of lent quota)
    by_job: str | None = None
    lost_work_seconds: float = 0.0  # the work it loses: since its latest checkpoint, or its start


@dataclass(slots=True)
class ClusterState:
    """Inventory with the current allocations already applied to the nodes' GPUs."""

    nodes: dict[str, Node]
    running: list[Allocation] = field(default_factory=list)
    quotas: dict[str, float] = field(default_factory=dict)  # tenant -> guaranteed GPUs; empty = no quotas
    now: float = 0.0


@dataclass(slots=True)
class SchedulerConfig:
    """Every policy knob of the core. The defaults are GPUYard's own scheduler.

    policy: where a replica goes (`Policy`): gpuyard (default), fgd, bestfit or firstfit.
    fair_share: inside one priority class, serve the tenant with the smallest weighted dominant share
        (DRF over GPUs, CPUs, memory) first; off = arrival order inside a class.
    tenant_weights: tenant -> weight for fair share (default 1; a weight of 2 earns twice the share).
    user_gpu_cap: tenant -> most GPUs one user of that tenant may hold; key "*" applies to every tenant.
    borrowing: a tenant may run above its guarantee on idle GPUs (that work is reclaimable).
    preemption: higher-priority jobs and quota reclaims may preempt running jobs.
    min_runtime_before_preemption: seconds a job runs before it may be preempted (no thrashing).
    backfill (`BackfillMode`): easy (default) = the first job blocked on resources gets a reservation from the
        running jobs' time limits and later jobs start only if they do not delay it; greedy = anything that
        fits starts (big jobs can starve); off = strict order, nothing passes a blocked job (FIFO).
    reservation_depth: with easy backfill, how many jobs blocked on resources get a reservation (the first ones
        in line; Maui's RESERVATIONDEPTH). 1 = classic EASY, where jobs that need a scarce kind of node wait
        for it one after the other.
    shape_popularity: ((TaskShape, weight), ...) that fragmentation-aware policies optimise for; None = learn it
        each cycle from the queue and the running jobs.
    keep_scarce_nodes: a job that could run on many nodes keeps off the few nodes that waiting jobs can only run
        on (`core/scarcity.py`), even when they are the only ones free; off = any node that fits.
    short_first_window: seconds; inside a tenant's (and a class's) jobs, a job's place in line is its arrival
        plus its time limit, at most this (no time limit: all of it): a short job passes longer ones that
        arrived shortly before it, never one that has waited this long (`core/queue.py`, `line_order`). With a
        window the backfill reservations go to the oldest waiting jobs, made before the cycle places anything
        (`cycle._Cycle.protect`), not to the first blocked ones in line: the `reservation_depth` oldest, and
        the `shape_reservations` oldest of each shape. 0 = arrival order, reservations in line order.
    shape_reservations: with a short-first window, how many of the oldest waiting jobs of each shape class
        (GPUs per replica, whole or a share, GPU models, replicas, how many nodes could hold one) get a
        reservation besides the `reservation_depth` oldest of all: a job of a rare shape (a whole 8-GPU node
        in a queue of single GPUs) is protected while it is young, before long jobs fill the nodes that would
        drain for it. 0 = only the `reservation_depth` oldest.
    """

    policy: Policy = Policy.GPUYARD
    fair_share: bool = True
    tenant_weights: dict[str, float] = field(default_factory=dict)
    user_gpu_cap: dict[str, float] = field(default_factory=dict)
    borrowing: bool = True
    preemption: bool = True
    min_runtime_before_preemption: float = 300.0
    backfill: BackfillMode = BackfillMode.EASY
    reservation_depth: int = 8
    shape_popularity: tuple | None = None
    keep_scarce_nodes: bool = True
    short_first_window: float = 3600.0
    shape_reservations: int = 2


@dataclass(slots=True)
class CycleResult:
    placements: list[Placement] = field(default_factory=list)
    preemptions: list[Preemption] = field(default_factory=list)
    pending: Mapping[str, Reason] = field(default_factory=dict)  # a `queue.Pending` from `decide`
