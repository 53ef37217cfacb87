"""1,000 short jobs, gangs of 16 replicas among them, through `gpuyard up --simulate-gpus 8` while the
scheduler, an executor, the submit service and NATS are each killed with SIGKILL twice, in random order
(benchmarks/chaos.py, which runs it with larger numbers), with the platform's limits set low and a hostile
tenant reaching each of them meanwhile. Every accepted job must succeed: none lost, none run twice, none stuck;
every limit answers as it says (401, 413, 429, or 503 while a service is down), never otherwise."""

from __future__ import annotations

import pytest

from benchmarks.chaos import TARGETS, run_chaos

pytestmark = pytest.mark.integration

UNFINISHED_AFTER = 1800
"""Seconds after which a job that has not ended counts as stuck: a generous bound on the wait (the wait ends as
soon as every job has), not a speed claim; how long the run takes is benchmarks/chaos.py's figure."""


def test_every_job_succeeds_once_while_services_and_nats_are_killed(tmp_path):
    result = run_chaos(
        jobs=1000, kills=2, gang_every=100, seed=24, deadline=UNFINISHED_AFTER, workdir=tmp_path
    )
    summary = result.summary()
    print(summary)
    assert [k.target for k in result.kills].count("executor") == 2 and len(result.kills) == 2 * len(TARGETS)
    assert all(k.back_after_s is not None for k in result.kills), result.kills
    assert result.accepted == 1000, summary
    assert result.gangs == 10, summary
    assert not result.lost, f"accepted, unknown to the API: {result.lost[:10]}"
    assert not result.twice, f"replicas that ran more than once: {result.twice[:10]}"
    assert not result.stuck, f"still open when the wait gave up: {result.stuck[:10]}"
    assert not result.failed, f"finished without success: {result.failed[:10]}"
    assert result.succeeded == 1000 + result.hostile_jobs
    assert result.reached_every_limit(), summary
    assert not result.unexpected, result.unexpected[:10]
    assert result.truncated, "no hostile job's output ends with the log budget's line"
