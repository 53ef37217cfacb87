"""Jobs with an environment of their own go only to nodes that build for their Python version; one no node
offers waits with `no_python` (no place in line), saying what the nodes offer."""

from __future__ import annotations

from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.scheduling import SchedulerConfig
from gpuyard.shared.scheduling.cluster import HeldCluster
from gpuyard.shared.scheduling.cycle import decide
from gpuyard.shared.scheduling.inputs import request_of
from gpuyard.shared.scheduling.model import ANY_PYTHON
from tests.unit.services.scheduler.builders import cluster, decide_snapshot, job, node


def with_pythons(n, *versions):
    n.pythons = frozenset(versions)
    return n


def placed_on(result) -> dict[str, str]:
    return {p.job_id: p.replicas[0].node for p in result.placements}


FIRSTFIT = SchedulerConfig(policy="firstfit")


def test_a_job_goes_only_to_a_node_that_offers_its_python():
    state = cluster(node("n0", 2), with_pythons(node("n1", 2), "3.11"), with_pythons(node("n2", 2), "3.12"))
    queue = [
        job("plain"),
        job("py311", python="3.11"),
        job("py312", python="3.12"),
        job("any", python=ANY_PYTHON),
    ]
    assert placed_on(decide_snapshot(state, queue, FIRSTFIT)) == {
        "plain": "n0",
        "py311": "n1",
        "py312": "n2",
        "any": "n1",
    }


def test_a_python_no_node_offers_waits_out_of_line_and_says_what_they_offer():
    state = cluster(with_pythons(node("n0", 2), "3.11", "3.9"), node("n1", 2))
    result = decide_snapshot(
        state, [job("old", python="3.13"), job("other", python="3.13"), job("plain")], FIRSTFIT
    )
    reason = result.pending["old"]
    assert reason.code == PendingCode.NO_PYTHON and reason.position is None
    assert reason.message == "needs python 3.13 for its environment; the nodes offer python 3.9, 3.11"
    assert result.pending["other"].code == PendingCode.NO_PYTHON
    assert placed_on(result) == {"plain": "n0"}


def test_no_node_that_builds_environments_at_all():
    result = decide_snapshot(cluster(node("n0", 2)), [job("any", python=ANY_PYTHON)], FIRSTFIT)
    assert result.pending["any"].message == "needs a Python environment; no node builds job environments"


def test_a_job_waits_its_turn_when_only_busy_nodes_offer_its_python():
    state = cluster(with_pythons(node("n0", 1), "3.11"), node("n1", 4))
    result = decide_snapshot(state, [job("a", python="3.11"), job("b", python="3.11")], FIRSTFIT)
    assert placed_on(result) == {"a": "n0"}
    assert result.pending["b"].code == PendingCode.INSUFFICIENT_GPUS  # (n1 has GPUs, but not its python)


def test_a_held_cluster_sees_a_node_start_offering_a_python():
    held = HeldCluster()
    held.put_node(node("n0", 2))
    first = decide(held.index(), held.allocations(), [job("a", python="3.11")], FIRSTFIT)
    held.decided(first)
    assert first.pending["a"].code == PendingCode.NO_PYTHON
    held.put_node(with_pythons(node("n0", 2), "3.11"))
    assert placed_on(decide(held.index(), held.allocations(), [job("a", python="3.11")], FIRSTFIT)) == {
        "a": "n0"
    }


def test_the_request_of_a_spec_wants_its_environment_s_python():
    def wanted(**env):
        return request_of(JobSpec(command="true", environment=env or None)).python

    assert wanted(pip=["numpy"], python="3.11") == "3.11"
    assert wanted(pip=["numpy"]) == ANY_PYTHON
    assert wanted(image="python:3.11") == "" and wanted() == ""
    assert job("a", python="3.11").key != job("a").key
