"""A job no node could ever hold is refused at submit (422, with the largest node and the whole cluster),
unless GPUYARD_ACCEPT_UNPLACEABLE queues it; the rule is the scheduler's own `never_fits`, asked on the nodes
heard from (services/submit/placeability.py)."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuyard.services.submit.placeability import MEMO_MAX, Placeability
from gpuyard.services.submit.telemetry import Telemetry
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuInfo, NodeHeartbeat, NodeLost
from gpuyard.shared.contracts.jobspec import JobSpec
from tests.unit.services.submit.test_submit_api import VISION, api, ctx  # noqa: F401 (fixtures)

GIB = 2**30


def node(name: str, gpus: int, model: str = "A100", gpu_memory: int = 80 * GIB, cpus=32, memory=256 * GIB):
    infos = [GpuInfo(index=i, uuid=f"{name}-{i}", model=model, memory_bytes=gpu_memory) for i in range(gpus)]
    return NodeHeartbeat(node=name, gpus=infos, cpus=cpus, memory_bytes=memory)


def spec(**resources) -> JobSpec:
    replicas = resources.pop("replicas", 1)
    return JobSpec(command="true", replicas=replicas, resources=resources)


def heard(*nodes: NodeHeartbeat) -> Telemetry:
    telemetry = Telemetry()
    for hb in nodes:
        telemetry.observe(make_event(hb, source="/test"))
    return telemetry


def test_the_reason_names_the_largest_node_and_the_whole_cluster():
    unplaceable = Placeability(heard(node("a", 4), node("b", 2))).why_not
    assert unplaceable(spec(gpus=8)) == "needs 8 GPUs on one node; the largest node has 4 (a)"
    assert unplaceable(spec(gpus=4, replicas=2)) == (
        "needs 2 workers at once; the whole cluster holds only 1 of them"
    )
    assert unplaceable(spec(gpus=1, gpu_model=["H100"])) == "needs GPU model H100; no node has one"
    assert unplaceable(spec(cpus=64)).startswith("needs 64 CPUs and 2 GB per replica; the largest")
    assert unplaceable(spec(gpus=4)) is None and unplaceable(spec(gpus=0.5, replicas=12)) is None
    assert Placeability(Telemetry()).why_not(spec(gpus=64)) is None  # no node known yet: nothing can be said


def test_the_answer_follows_the_nodes_as_they_change_join_and_are_lost():
    telemetry = heard(node("a", 4))
    unplaceable = Placeability(telemetry).why_not
    assert unplaceable(spec(gpus=8)) == "needs 8 GPUs on one node; the largest node has 4 (a)"
    telemetry.observe(make_event(node("a", 8), source="/test"))  # the same node, with more GPUs now
    assert unplaceable(spec(gpus=8)) is None
    telemetry.observe(make_event(node("b", 2, model="H100"), source="/test"))
    assert unplaceable(spec(gpus=2, gpu_model=["H100"], replicas=2)) == (
        "needs 2 workers at once; the whole cluster holds only 1 of them"
    )
    lost = NodeLost(node="b", last_seen=datetime.now(UTC))
    telemetry.observe(make_event(lost, source="/test"))
    assert unplaceable(spec(gpus=1, gpu_model=["H100"])) == "needs GPU model H100; no node has one"


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


def test_specs_of_ever_new_shapes_keep_what_is_remembered_bounded():
    placeability = Placeability(heard(node("a", 4)))
    for n in range(MEMO_MAX * 2):
        assert placeability.why_not(spec(gpus=1, gpu_memory=f"{n + 1}MiB", cpus=1 + n / 1000)) is None
    assert len(placeability._answers) <= MEMO_MAX and len(placeability._held[1].memo) <= MEMO_MAX
