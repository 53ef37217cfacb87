"""A gang's replicas on one node ending together, with the local backend: every exit is recorded, and the
attempt ends (a regression test: with nine replicas or more, the ninth exit ran out of the ledger's retries, the
watcher died with it, and the job stayed running for ever)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from gpuyard.shared.contracts.events.jobs import GpuShare, JobPlaced, ReplicaPlacement
from gpuyard.shared.stores.events import ConcurrencyError
from gpuyard.shared.stores.ledger import MAX_CONFLICT_RETRIES

REPLICAS = 16


@contextlib.contextmanager
def barrier(folder: Path):
    """A FIFO held open by the test: each replica opens it, says it runs, then reads it until the test closes
    its end, which every replica sees at the same moment (end of file)."""
    fifo = folder / "barrier"
    os.mkfifo(fifo)
    held = os.open(fifo, os.O_RDWR)  # a writer, so that the replicas' opens do not block
    try:
        yield held
    finally:
        with contextlib.suppress(OSError):
            os.close(held)


def at_once(folder: Path, code: int) -> str:
    """Each replica opens the barrier, says it runs, waits for the barrier to open, then exits with `code`."""
    return f"exec 3<{folder / 'barrier'}; echo $RANK >> {folder / 'ready'}; cat <&3 >/dev/null; exit {code}"


async def release(h, folder: Path, held: int, replicas: int = REPLICAS) -> None:
    ready = folder / "ready"
    await h.wait_for(
        lambda: ready.exists() and len(ready.read_text().split()) == replicas, what="every replica to run"
    )
    os.close(held)


async def test_a_gang_of_16_on_one_node_that_exits_at_once_succeeds_with_every_exit(h):
    ex = await h.executor()
    job = await h.submit(command="true", replicas=REPLICAS, resources={"gpus": 0})
    await h.place(ex, job)
    view = await h.wait(job, "succeeded")
    types = await h.types(job)
    assert types.count("replica_exited") == REPLICAS and types[-1] == "succeeded"
    assert sorted(e.replica for e in view.exits) == list(range(REPLICAS))
    assert len(h.ledger._turns) == 0  # no job held once nothing is written


async def test_a_gang_of_16_sharing_two_simulated_gpus_released_together_succeeds(h, tmp_path):
    """Eighth-GPU replicas, eight to each of the node's two simulated GPUs."""
    ex = await h.executor(simulate_gpus=2)
    job = await h.submit(command=at_once(tmp_path, 0), replicas=REPLICAS, resources={"gpus": 0.125})
    shares = [[GpuShare(index=r % 2, fraction=0.125)] for r in range(REPLICAS)]
    with barrier(tmp_path) as held:
        await h.place(ex, job, gpus=shares)
        await release(h, tmp_path, held)
    view = await h.wait(job, "succeeded")
    assert (await h.types(job)).count("replica_exited") == REPLICAS
    assert {e.exit_code for e in view.exits} == {0}


class ContendedStore:
    """The store, as if other processes' writes to the job landed first `times` times in a row (more than the
    ledger retries on its own)."""

    def __init__(self, inner, times: int):
        self.inner, self.times = inner, times

    def __getattr__(self, name):
        return getattr(self.inner, name)

    async def append_many(self, appends):
        if self.times:
            self.times -= 1
            return [
                ConcurrencyError(a.stream_id, a.expected_version, a.expected_version + 1) for a in appends
            ]
        return await self.inner.append_many(appends)


async def test_a_start_and_an_exit_that_other_writers_keep_beating_are_written_again_until_they_land(
    h, tmp_path
):
    ex = await h.executor()
    job = await h.submit(command=at_once(tmp_path, 0))
    placed = JobPlaced(job_id=job, attempt=1, placements=[ReplicaPlacement(replica=0, node="node-a")])
    await h.ledger.append(job, placed)
    h.ledger.store = contended = ContendedStore(h.store, times=MAX_CONFLICT_RETRIES + 2)
    with barrier(tmp_path) as held:
        await h.deliver(ex, placed)  # the start is written again until it lands
        assert contended.times == 0 and await h.types(job) == ["submitted", "placed", "started"]
        contended.times = MAX_CONFLICT_RETRIES + 2
        await release(h, tmp_path, held, replicas=1)
        view = await h.wait(job, "succeeded")
    assert contended.times == 0 and [e.replica for e in view.exits] == [0]
