"""GPU health from a node's own samples (`gpuyard.services.monitor.health`): a fatal XID, new uncorrected ECC errors or
a GPU lost mark it unhealthy, once; an application XID (13, 31, 43, 45, 68, 109) does not; another node's
sample changes nothing; the mark is recorded in the node's stream of the event store."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gpuyard.services.monitor.health import HealthJudge, HealthMarker
from gpuyard.services.monitor.ingest import SampleIngest
from gpuyard.services.monitor.rules import APPLICATION_XIDS
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuReading, GpuSample
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.readmodels import nodecontrol


def sample(node: str = "node-a", **gpu1) -> GpuSample:
    return GpuSample(
        node=node,
        gpus=[
            GpuReading(index=0, uuid="GPU-0", ecc_uncorrected=0),
            GpuReading(index=1, uuid="GPU-1", **gpu1),
        ],
    )


@pytest.mark.parametrize("xid", APPLICATION_XIDS)
def test_an_application_xid_leaves_the_gpu_healthy(xid):
    assert HealthJudge("node-a").judge(sample(xids=[xid], last_xid=xid)) == []


@pytest.mark.parametrize("xid", [48, 63, 74, 79, 94, 95, 119, 120])
def test_any_other_xid_marks_the_gpu_unhealthy(xid):
    [mark] = HealthJudge("node-a").judge(sample(xids=[13, xid], last_xid=xid))
    assert (mark.node, mark.index, mark.uuid, mark.healthy, mark.reason, mark.xid) == (
        "node-a",
        1,
        "GPU-1",
        False,
        "xid",
        xid,
    )
    assert f"fatal XID {xid}" in mark.message


def test_the_application_xids_are_those_of_the_k8s_device_plugin():
    assert set(APPLICATION_XIDS) == {13, 31, 43, 45, 68, 109}


def test_uncorrected_ecc_errors_mark_it_when_they_grow_not_again_while_they_stay():
    judge = HealthJudge("node-a")
    assert judge.judge(sample(ecc_uncorrected=0)) == []
    [mark] = judge.judge(sample(ecc_uncorrected=2))
    assert mark.reason == "ecc_uncorrected" and mark.index == 1 and "2 uncorrected" in mark.message
    assert judge.judge(sample(ecc_uncorrected=2)) == []
    assert [m.reason for m in judge.judge(sample(ecc_uncorrected=3))] == ["ecc_uncorrected"]


def test_errors_counted_before_the_monitor_started_count_in_its_first_sample():
    assert [m.reason for m in HealthJudge("node-a").judge(sample(ecc_uncorrected=1))] == ["ecc_uncorrected"]


def test_a_lost_gpu_is_marked_once():
    judge = HealthJudge("node-a")
    [mark] = judge.judge(sample(lost=True))
    assert mark.reason == "lost" and mark.index == 1
    assert judge.judge(sample(lost=True)) == []


def test_another_nodes_sample_is_not_judged():
    assert HealthJudge("node-a").judge(sample("node-b", xids=[79], lost=True)) == []


async def test_the_marker_records_the_mark_in_the_nodes_stream_and_publishes_it(tmp_path):
    store = await open_store(f"sqlite:///{tmp_path / 'events.db'}")
    published = []

    async def publish(event):
        published.append(event)

    service = SimpleNamespace(store=store, bus=SimpleNamespace(publish=publish), source="/monitor")
    marker = HealthMarker(service, "node-a")
    ingest = SampleIngest()
    marker.attach(ingest)
    ingest.ingest(make_event(sample(xids=[79]), source="/monitor"))
    mark, taken_at = marker.marks.get_nowait()
    await marker.record(mark, taken_at)
    await marker.record(mark, taken_at)  # the same mark again (a redelivery): recorded once
    control = await nodecontrol.read(store, "node-a")
    assert control.unhealthy == {1: "fatal XID 79"} and not control.usable(1) and control.usable(0)
    assert len(await store.read_stream(nodecontrol.stream_id("node-a"))) == 1
    assert [e.type for e in published] == ["io.gpuyard.node.gpu_health"] * 2
    await store.close()
