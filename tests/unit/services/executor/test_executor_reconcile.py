"""A restarted executor reconciles every job placed on its node, even when one of them cannot be read."""

from __future__ import annotations

from pydantic import BaseModel

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.stores.events import Projection


class Unreadable(BaseModel):
    """A job's stored view that today's model refuses (e.g. written by an older release with looser rules)."""

    job_id: str
    state: str = "placed"


async def test_one_unreadable_job_does_not_stop_the_others_from_starting(h, tmp_path):
    runs = tmp_path / "runs"
    first = await h.executor()
    job = await h.submit(command=f"echo run >> {runs}")
    placed = await h.place(first, job)
    await h.wait(job, "succeeded")
    runs.unlink()
    await first.shutdown()
    h.executors.remove(first)

    broken = Projection(
        "broken", "team", "placed", "9999-01-01T00:00:00+00:00", 1, Unreadable(job_id="broken")
    )
    submitted = JobSubmitted(
        job_id="broken", name="b", tenant="team", user="ana", spec=JobSpec(command="true")
    )
    await h.store.append(
        "broken", 0, [make_event(submitted, source="/old")], projection=broken
    )  # listed first
    waiting = await h.submit(command=f"echo run >> {runs}")
    await h.ledger.append(waiting, placed.model_copy(update={"job_id": waiting}))

    again = await h.executor()
    await again.reconcile()
    assert (await h.wait(waiting, "succeeded")).state == "succeeded"
    assert runs.read_text() == "run\n"
