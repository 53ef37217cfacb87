"""A job no node could ever hold is refused at submit (422, with the largest node and the whole cluster),
unless GPUYARD_ACCEPT_UNPLACEABLE queues it; the rule (shared/capacity.py) answers as the scheduler's own
`never_fits` does, on any cluster."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuyard.services.scheduler.view import job_request
from gpuyard.shared.capacity import unplaceable
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import JobSubmitted
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import fold
from gpuyard.shared.scheduling.demand import demand_of
from gpuyard.shared.scheduling.explain import never_fits
from gpuyard.shared.scheduling.index import CapacityIndex
from tests.unit.test_submit_api import VISION, api, ctx  # noqa: F401 (fixtures)

GIB = 2**30


def node(name: str, gpus: int, model: str = "A100", gpu_memory: int = 80 * GIB, cpus=32, memory=256 * GIB):
    infos = [GpuInfo(index=i, uuid=f"{name}-{i}", model=model, memory_bytes=gpu_memory) for i in range(gpus)]
    return NodeHeartbeat(node=name, gpus=infos, cpus=cpus, memory_bytes=memory)


def spec(**resources) -> JobSpec:
    replicas = resources.pop("replicas", 1)
    return JobSpec(command="true", replicas=replicas, resources=resources)


def test_the_reason_names_the_largest_node_and_the_whole_cluster():
    nodes = [node("a", 4), node("b", 2)]
    assert unplaceable(spec(gpus=8), nodes) == "needs 8 GPUs on one node; the largest node has 4 (a)"
    assert unplaceable(spec(gpus=4, replicas=2), nodes) == (
        "needs 2 workers at once; the whole cluster holds only 1 of them"
    )
    assert unplaceable(spec(gpus=1, gpu_model=["H100"]), nodes) == "needs GPU model H100; no node has one"
    assert unplaceable(spec(cpus=64), nodes).startswith("needs 64 CPUs and 2 GB per replica; the largest")
    assert (
        unplaceable(spec(gpus=4), nodes) is None and unplaceable(spec(gpus=0.5, replicas=12), nodes) is None
    )
    assert unplaceable(spec(gpus=64), []) is None  # no node known yet: nothing can be said


def test_the_api_refuses_a_job_no_node_could_hold_and_queues_it_when_asked(api, ctx):  # noqa: F811
    ctx.telemetry.observe(make_event(node("a", 4), source="/test"))
    refused = api.post("/v1/jobs", json={"command": "true", "resources": {"gpus": 8}}, headers=VISION)
    assert refused.status_code == 422
    assert refused.json()["detail"].startswith(
        "no node could ever hold this job: needs 8 GPUs on one node; the largest node has 4 (a)"
    )
    assert (
        api.post("/v1/jobs", json={"command": "true", "resources": {"gpus": 4}}, headers=VISION).status_code
        == 202
    )
    ctx.accept_unplaceable = True
    assert (
        api.post("/v1/jobs", json={"command": "true", "resources": {"gpus": 8}}, headers=VISION).status_code
        == 202
    )


def test_more_gpus_than_a_replica_may_have_is_refused_with_the_clusters_size_even_when_queued(api, ctx):  # noqa: F811
    def submit(gpus):
        return api.post("/v1/jobs", json={"command": "true", "resources": {"gpus": gpus}}, headers=VISION)

    no_node_yet = submit(100)
    assert no_node_yet.status_code == 422
    assert no_node_yet.json()["detail"] == "needs 100 GPUs on one node; a replica may have at most 64"
    ctx.telemetry.observe(make_event(node("vm", 4), source="/test"))
    ctx.accept_unplaceable = True  # a cluster that grows: still not past the schema's bound
    refused = submit(100)
    assert refused.status_code == 422
    assert refused.json()["detail"] == (
        "no node could ever hold this job: needs 100 GPUs on one node; the largest node has 4 (vm)"
    )
    checked = api.post("/v1/jobs/validate", json={"command": "x", "resources": {"gpus": 65}}, headers=VISION)
    assert checked.status_code == 422 and "the largest node has 4 (vm)" in checked.json()["detail"]
    assert submit(64).status_code == 202  # (queued, as the platform keeps such jobs)


gpu_counts = st.integers(0, 8)
nodes_strategy = st.lists(
    st.builds(
        lambda i, n, model, mem, cpus, memory: node(f"n{i}", n, model, mem * GIB, cpus, memory * GIB),
        st.integers(0, 99),
        gpu_counts,
        st.sampled_from(["A100", "H100"]),
        st.sampled_from([16, 40, 80]),
        st.sampled_from([2, 8, 32]),
        st.sampled_from([4, 64, 256]),
    ),
    min_size=1,
    max_size=5,
    unique_by=lambda hb: hb.node,
)
specs = st.builds(
    lambda gpus, replicas, models, gpu_memory, cpus, memory: spec(
        gpus=gpus,
        replicas=replicas,
        gpu_model=models,
        gpu_memory=f"{gpu_memory}GiB" if gpu_memory and gpus else None,
        cpus=cpus,
        memory=f"{memory}GiB",
    ),
    st.sampled_from([0, 0.25, 0.5, 1, 2, 4, 8, 16]),
    st.integers(1, 12),
    st.sampled_from([[], ["A100"], ["H100"], ["A100", "H100"]]),
    st.sampled_from([0, 20, 60]),
    st.sampled_from([0.5, 4, 16, 64]),
    st.sampled_from([1, 32, 300]),
)


@settings(max_examples=400, deadline=None)
@given(nodes_strategy, specs)
def test_the_submit_rule_answers_as_the_schedulers(nodes, job_spec):
    index = CapacityIndex(
        [n.node for n in nodes],
        [[g.model for g in n.gpus] for n in nodes],
        [[float(g.memory_bytes) for g in n.gpus] for n in nodes],
        [n.cpus for n in nodes],
        [float(n.memory_bytes) for n in nodes],
    )
    view = fold(
        [make_event(JobSubmitted(job_id="j", name="j", tenant="t", user="u", spec=job_spec), source="/t")]
    )
    job = job_request(view)
    assert (unplaceable(job_spec, nodes) is None) == (never_fits(index, job, demand_of(job)) is None)
