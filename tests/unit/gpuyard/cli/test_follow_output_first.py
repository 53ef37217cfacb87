"""`submit --follow` prints every replica's output before the event that ends the job, even when a replica's
output stream is behind the events (a short job's `started`, `replica_exited` and `succeeded` come together,
and its output comes through one thread per replica)."""

from __future__ import annotations

import json
import threading
from io import StringIO

from rich.console import Console

from gpuyard import follow
from gpuyard.follow import follow_job
from gpuyard.shared.contracts.api.jobs import JobEventOut
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    JobPlaced,
    JobReplicaExited,
    JobStarted,
    JobSubmitted,
    JobSucceeded,
    ReplicaPlacement,
)
from gpuyard.shared.contracts.jobspec import JobSpec

WAIT = 30  # seconds; only a broken test waits that long


def stored(datas) -> list[JobEventOut]:
    events = [json.loads(make_event(d, source="/test").to_json()) for d in datas]
    return [JobEventOut(version=v, event=e) for v, e in enumerate(events, start=1)]


class Screen(StringIO):
    """What the console printed, with a witness for the job's end line."""

    def __init__(self) -> None:
        super().__init__()
        self.end_printed = threading.Event()

    def write(self, text: str) -> int:
        if "succeeded" in text:
            self.end_printed.set()
        return super().write(text)


class TwoReplicaJob:
    """A job of two replicas whose events all come in the first read, and whose replica 1's output stream
    yields its last line only once the follower is done with the events: once it prints the job's end, or once
    it waits for the output (the witness `wait_entered`)."""

    def __init__(self, screen: Screen, wait_entered: threading.Event, hold: threading.Event | None = None):
        self.screen, self.wait_entered, self.hold = screen, wait_entered, hold
        placed = [ReplicaPlacement(replica=r, node=f"n{r}") for r in (0, 1)]
        self.all = stored(
            [
                JobSubmitted(
                    job_id="j", name="n", tenant="t", user="u", spec=JobSpec(command="x", replicas=2)
                ),
                JobPlaced(job_id="j", attempt=1, placements=placed),
                JobStarted(job_id="j", attempt=1, node="n0", replicas=[0]),
                JobStarted(job_id="j", attempt=1, node="n1", replicas=[1]),
                JobReplicaExited(job_id="j", attempt=1, node="n0", replica=0, exit_code=0),
                JobReplicaExited(job_id="j", attempt=1, node="n1", replica=1, exit_code=0),
                JobSucceeded(job_id="j", attempt=1),
            ]
        )

    def events(self, job_id: str, after: int = 0) -> list[JobEventOut]:
        return [e for e in self.all if e.version > after]

    def follow_logs(self, job_id: str, replica: int, attempt: int):
        yield f"hello from {replica}\n".encode()
        if replica == 1:
            done_with_events = threading.Event()
            for witness in (self.screen.end_printed, self.wait_entered):
                threading.Thread(target=lambda w=witness: w.wait(WAIT) and done_with_events.set()).start()
            assert done_with_events.wait(WAIT)
            if self.hold is not None:  # a stream that stalls past the follower's wait
                self.hold.wait(WAIT)
            yield b"done\n"


class Follower:
    """Watches the follower's `ReplicaOutput`: `entered` is set when it starts waiting for the replicas'
    output (with `timeout`, when given, instead of its own)."""

    def __init__(self, monkeypatch, timeout: float | None = None) -> None:
        self.entered = threading.Event()
        self.output: follow.ReplicaOutput | None = None
        original = follow.ReplicaOutput.wait

        def wait(output, *args):
            self.output = output
            self.entered.set()
            return original(output, *((timeout,) if timeout is not None else args))

        monkeypatch.setattr(follow.ReplicaOutput, "wait", wait)


def test_every_replicas_output_is_printed_before_the_jobs_end(monkeypatch):
    screen = Screen()
    client = TwoReplicaJob(screen, Follower(monkeypatch).entered)
    state = follow_job(client, "j", Console(file=screen, width=200), poll=0, logs=True)
    lines = screen.getvalue().splitlines()
    assert state == "succeeded"
    assert {"r0 | hello from 0", "r1 | hello from 1", "r1 | done"} <= set(lines)
    assert lines[-1].endswith("succeeded")


def test_a_stream_stalled_past_the_wait_is_said_and_nothing_comes_after_the_end(monkeypatch):
    screen, hold = Screen(), threading.Event()
    follower = Follower(monkeypatch, timeout=0.5)  # (the stream stalls until the test lets it go)
    client = TwoReplicaJob(screen, follower.entered, hold)
    follow_job(client, "j", Console(file=screen, width=200), poll=0, logs=True)
    shown = screen.getvalue()
    hold.set()  # the stalled stream brings its last line now, after the job's end was printed
    for _, thread in follower.output.threads:
        thread.join(WAIT)
        assert not thread.is_alive()
    lines = screen.getvalue().splitlines()
    assert screen.getvalue() == shown  # nothing printed after the end
    assert "r1 | done" not in lines and lines[-1].endswith("succeeded")
    assert (
        "(replica 1: the rest of its output has not come yet; `gpuyard logs j --replica 1` shows it)" in lines
    )
