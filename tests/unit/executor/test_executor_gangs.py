"""A gang's replicas on one node ending together, with the local backend: every exit is recorded, and the
attempt ends (issue 24: with nine replicas or more, the ninth exit ran out of the ledger's retries, the
watcher died with it, and the job stayed running for ever)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from shared.events import GpuShare

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


async def release(h, folder: Path, held: int) -> None:
    ready = folder / "ready"
    await h.wait_for(
        lambda: ready.exists() and len(ready.read_text().split()) == REPLICAS, what="every replica to run"
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
