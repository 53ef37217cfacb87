"""`submit --follow` prints every event of a job up to the one that ends it, even when the job ends between
two reads of its events (a short job's `started`, `replica_exited` and `succeeded` arrive together)."""

from __future__ import annotations

import json
from io import StringIO

from rich.console import Console

from gpuyard.follow import follow_job
from gpuyard.shared.contracts.api.jobs import JobEventOut, JobOut, job_out
from gpuyard.shared.contracts.events.envelope import CloudEvent, make_event
from gpuyard.shared.contracts.events.jobs import (
    JobPlaced,
    JobReplicaExited,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import fold


def stored(datas) -> list[JobEventOut]:
    events = [json.loads(make_event(d, source="/test").to_json()) for d in datas]
    return [JobEventOut(version=v, event=e) for v, e in enumerate(events, start=1)]


class RacingClient:
    """The store as a fast job leaves it: the first read of the events finds `submitted` and `placed`, and by
    the time anything else is asked, the job has succeeded."""

    def __init__(self):
        spec = JobSpec(command=["true"])
        self.all = stored(
            [
                JobSubmitted(job_id="j", name="n", tenant="t", user="u", spec=spec),
                JobPlaced(job_id="j", attempt=1, placements=[ReplicaPlacement(replica=0, node="n1")]),
                JobStarted(job_id="j", attempt=1, node="n1", replicas=[0]),
                JobReplicaExited(job_id="j", attempt=1, node="n1", replica=0, exit_code=0),
                JobSucceeded(job_id="j", attempt=1),
            ]
        )
        self.visible = 2

    def events(self, job_id: str, after: int = 0) -> list[JobEventOut]:
        found = [e for e in self.all[: self.visible] if e.version > after]
        self.visible = len(self.all)  # the job ends right after this read
        return found

    def job(self, job_id: str) -> JobOut:
        view = fold([CloudEvent.model_validate(e.event) for e in self.all[: self.visible]])
        return job_out(view)


def test_follow_prints_the_events_that_came_with_the_end():
    text = StringIO()
    state = follow_job(RacingClient(), "j", Console(file=text, width=200), poll=0)
    lines = text.getvalue().splitlines()
    assert state == "succeeded"
    assert [line.split("  ", 2)[-1].split(" ")[0] for line in lines] == [
        "submitted",
        "placed",
        "started",
        "replica",
        "succeeded",
    ]
