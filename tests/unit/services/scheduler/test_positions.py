"""Places in line: a job no node could ever hold (`too_large`, `no_matching_gpu_model`; queued
only with GPUYARD_ACCEPT_UNPLACEABLE) has no place in line and never counts in another job's, whether the cycle
looks at the jobs one by one or answers a long queue from the order (`Pending`)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from gpuyard.services.scheduler.handlers import SchedulerHandlers
from gpuyard.services.scheduler.service import SchedulerService
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobSubmitted
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.scheduling import HeldQueue, SchedulerConfig
from gpuyard.shared.scheduling import cycle as cycle_module
from gpuyard.shared.scheduling.reasons import Blocker
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import Decision, JobLedger
from gpuyard.shared.stores.readmodels.queueline import LINE_KEY
from tests.unit.services.scheduler.builders import cluster, decide_snapshot, job, node, running
from tests.unit.services.scheduler.test_deep_queue import cycle, full_node

OUT_OF_LINE = {"too_large", "no_matching_gpu_model"}


def huge(job_id: str, submitted_at: float, tenant: str = "t0"):
    """16 GPUs on one node: no node of these clusters has more than 8."""
    return job(job_id, 16, tenant=tenant, submitted_at=submitted_at)


def h100(job_id: str, submitted_at: float, tenant: str = "t0"):
    """A GPU model no node has."""
    return job(job_id, 1, tenant=tenant, gpu_models=("H100",), submitted_at=submitted_at)


def test_a_job_behind_two_jobs_no_node_could_hold_is_first_in_line() -> None:
    state = cluster(node("n0", 1), running=[running(job("x", 1), "n0", [0], 0)])
    queue = [
        huge("huge", 1),
        h100("h100", 2),
        job("next", 1, tenant="t0", submitted_at=3),
        job("after", 1, tenant="t0", submitted_at=4),
    ]
    pending = decide_snapshot(state, queue, SchedulerConfig()).pending
    assert {j: (r.code, r.position) for j, r in pending.items()} == {
        "huge": ("too_large", None),
        "h100": ("no_matching_gpu_model", None),
        "next": ("insufficient_gpus", 1),
        "after": ("insufficient_gpus", 2),
    }
    assert "1st in line" in pending["next"].message
    assert "in line" not in pending["huge"].message and "in line" not in pending["h100"].message


def test_no_nodes_yet_keeps_every_job_in_line() -> None:
    """Before any node has joined nothing is judged too large: the jobs wait for the first nodes, in order."""
    pending = decide_snapshot(cluster(), [job("a", 1, submitted_at=1), job("b", 16, submitted_at=2)]).pending
    assert [(pending[j].code, pending[j].position) for j in ("a", "b")] == [("no_nodes", 1), ("no_nodes", 2)]


def deep_queue(waiting: int, never: dict[int, object], tenants: int) -> list:
    """`waiting` jobs of 1/8 GPU in `tenants` tenants, and a job no node could hold just before job k for each k
    of `never` (made by `never[k]`, in job k's tenant)."""
    out = []
    for k in range(waiting):
        tenant = f"t{k % tenants}"
        if k in never:
            out.append(never[k](f"never-{k:06d}", 999.5 + k, tenant))
        out.append(job(f"wait-{k:06d}", 0.125, tenant=tenant, cpus=1, submitted_at=1000.0 + k))
    return out


def test_a_long_queue_answered_from_the_order_skips_the_jobs_no_node_could_hold(monkeypatch) -> None:
    """One tenant, 20,000 small jobs on a full node: two jobs no node could hold at the head and two more
    deep in the line, where the cycle does not look at the jobs one by one."""
    never = {0: huge, 1: h100, 12_000: huge, 12_001: h100}
    queue = HeldQueue(deep_queue(20_000, never, tenants=1))
    made = [0]
    at = Blocker.at

    def counted(self, *args, **kwargs):
        made[0] += 1
        return at(self, *args, **kwargs)

    monkeypatch.setattr(Blocker, "at", counted)
    pending = cycle(full_node(), queue).pending
    # the cycle stopped: the rest is answered from the order (the oldest jobs, which may get reservations with
    # the short-first window, are looked at one by one: at most reservation_depth more)
    assert made[0] <= 8 + SchedulerConfig().reservation_depth
    assert len(pending) == 20_004
    assert [pending[f"wait-{k:06d}"].position for k in (0, 1, 11_999, 12_000, 12_001, 19_999)] == [
        1,
        2,
        12_000,
        12_001,
        12_002,
        20_000,
    ]
    for k in never:
        assert pending[f"never-{k:06d}"].code in OUT_OF_LINE and pending[f"never-{k:06d}"].position is None
    in_order = pending.window(1, len(pending))  # every waiting job, in the cycle's order
    assert [j for j, _ in in_order] == [
        j.job_id for j in sorted(queue.jobs.values(), key=lambda j: j.submitted_at)
    ]
    assert [r.position for _, r in in_order if r.position is not None] == list(range(1, 20_001))
    assert pending.line() == [j for j, r in in_order if r.position is not None]  # (the line stored: places)
    assert pending.line(12_001) == pending.line()[:12_001]
    assert pending.window(12_002, 12_005) == [  # (slots: never-0, wait-0, never-1, wait-1, wait-2, ...)
        ("wait-011999", pending["wait-011999"]),
        ("never-012000", pending["never-012000"]),
        ("wait-012000", pending["wait-012000"]),
        ("never-012001", pending["never-012001"]),
    ]


@pytest.mark.parametrize("tenants", [1, 4])
def test_the_places_from_the_order_are_those_of_a_cycle_that_looks_at_every_job(monkeypatch, tenants) -> None:
    never = {k: (huge if k % 3 else h100) for k in (0, 3, 4, 57, 58, 59, 300, 599)}
    waiting = deep_queue(600, never, tenants)
    held = full_node()
    for k in range(5):
        held.drop(f"run-{k:06d}")
    lazy = cycle(held, HeldQueue(waiting))
    monkeypatch.setattr(cycle_module, "SETTLE_BY_SHAPE", False)  # every job considered one by one
    held = full_node()
    for k in range(5):
        held.drop(f"run-{k:06d}")
    full = cycle(held, list(waiting))
    assert lazy.placements == full.placements and len(lazy.placements) == 5
    assert lazy.pending.rest, "the cycle answered most of the queue from the order"
    assert dict(lazy.pending.items()) == dict(full.pending.items())
    places = sorted(r.position for r in full.pending.values() if r.position is not None)
    assert places == list(range(1, len(full.pending) - len(never) + 1))
    assert {j for j, r in full.pending.items() if r.position is None} == {f"never-{k:06d}" for k in never}
    in_line = sorted((r.position, j) for j, r in full.pending.items() if r.position is not None)
    assert lazy.pending.line() == [j for _, j in in_line]


async def test_the_live_scheduler_stores_places_that_skip_the_jobs_no_node_could_hold(tmp_path) -> None:
    """The scheduler service, as GPUYARD_ACCEPT_UNPLACEABLE=true leaves it: jobs no node could hold are queued
    (written here as the submit service writes them), and the places in line it stores skip them."""
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    submitter = JobLedger(store, None, "/test/submit")
    service = SimpleNamespace(
        store=store,
        ledger=JobLedger(store, None, "/test/scheduler"),
        bus=SimpleNamespace(js=None, replicas=1),
        source="/test/scheduler",
        stopping=asyncio.Event(),
    )
    scheduler = SchedulerService(service, SchedulerSettings(pending_after=0))
    gpus = [GpuInfo(index=0, uuid="GPU-0", model="SIM", memory_bytes=1 << 34)]
    scheduler.view.observe_node(
        NodeHeartbeat(node="node-a", gpus=gpus, cpus=8, memory_bytes=1 << 34, simulated=True)
    )
    scheduler.leading.set()
    handlers = SchedulerHandlers(scheduler)
    seen: dict[str, int] = {}

    async def submit(job_id: str, **resources) -> None:
        spec = JobSpec(command="true", resources={"cpus": 1, "memory": "1GiB", **resources})
        await submitter.record_many(
            [
                Decision(
                    job_id,
                    lambda _v: JobSubmitted(job_id=job_id, name=job_id, tenant="t", user="u", spec=spec),
                )
            ],
            new=True,
        )
        await deliver()

    async def deliver() -> None:
        for job_id in ("holder", "huge", "h100", "next", "after"):
            for stored in await store.read_stream(job_id, after_version=seen.get(job_id, 0)):
                event = stored.event  # (what its watch reads of it: job, id and kind)
                handlers.job_changed(event.subject, event.id, event.nats_subject)
                seen[job_id] = stored.version
        await scheduler.refresh_dirty()

    await submit("holder", gpus=1)
    await scheduler.decide_and_record()  # the node's one GPU is taken
    await deliver()
    await submit("huge", gpus=2)
    await submit("h100", gpus=1, gpu_model=["H100"])
    await submit("next", gpus=1)
    await submit("after", gpus=1)
    scheduler.decisions.line_stored_at = 0.0  # (the line's turn: every LINE_SECONDS)
    await scheduler.decide_and_record()
    stored = {j: (await store.get_projection(j))["pending"] for j in ("huge", "h100", "next", "after")}
    assert {j: (p["code"], p["position"]) for j, p in stored.items()} == {
        "huge": ("too_large", None),
        "h100": ("no_matching_gpu_model", None),
        "next": ("insufficient_gpus", 1),
        "after": ("insufficient_gpus", 2),
    }
    assert (await store.get_document(LINE_KEY))["jobs"] == ["next", "after"]  # (the line: places alone)

    # the holder is cancelled and `next` takes its GPU: `after` moves up to 1st, which its reason is not rewritten
    # for (the line says it), and the line is stored again at its next turn
    versions = {j: (await store.get_projection(j))["version"] for j in ("huge", "h100", "after")}
    await submitter.append("holder", JobCancelled(job_id="holder", attempt=1, by="u"))
    await deliver()
    scheduler.decisions.line_stored_at = 0.0  # (its turn has come)
    scheduler.decisions.pending_sent = {
        j: (*sent[:3], sent[3] - 60) for j, sent in scheduler.decisions.pending_sent.items()
    }  # (long ago)
    await scheduler.decide_and_record()
    await deliver()
    assert (await store.get_projection("next"))["state"] == "placed"
    assert {j: (await store.get_projection(j))["version"] for j in versions} == versions
    assert (await store.get_document(LINE_KEY))["jobs"] == ["after"]
    pending = (await store.get_projection("after"))["pending"]
    assert pending["text"] and pending["message"].startswith(pending["text"])
    stored = await store.get_document(LINE_KEY)
    await scheduler.decide_and_record()
    assert await store.get_document(LINE_KEY) == stored  # (not its turn yet)
    scheduler.decisions.line_stored_at = 0.0
    await scheduler.decide_and_record()
    assert (
        await store.get_document(LINE_KEY) == stored
    )  # (its turn, but the line is the same: not stored again)
    for job_id in ("huge", "h100", "after"):
        await submitter.append(job_id, JobCancelled(job_id=job_id, attempt=1, by="u"))
    await deliver()
    scheduler.decisions.line_stored_at = 0.0
    await scheduler.decide_and_record()
    assert (await store.get_document(LINE_KEY))["jobs"] == []  # nothing waits: stored once more, empty
    await store.close()
