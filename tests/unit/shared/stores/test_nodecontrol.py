"""A node's controls folded from its stream (`gpuyard.shared.stores.readmodels.nodecontrol.apply`): cordon, drain, uncordon of the node or
one GPU, and unhealthy marks, which only an uncordon clears."""

from __future__ import annotations

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHealthChanged, NodeAction, NodeControlChanged
from gpuyard.shared.stores.readmodels.nodecontrol import NodeControl, apply


def fold(*datas) -> NodeControl:
    control = NodeControl(node="n")
    for data in datas:
        control = apply(control, make_event(data, source="/test"))
    return control


def act(action: NodeAction, gpu: int | None = None) -> NodeControlChanged:
    return NodeControlChanged(node="n", gpu=gpu, action=action, by="root", reason="why")


BROKEN = GpuHealthChanged(node="n", index=2, reason="lost", message="GPU lost")


def test_a_node_cordon_keeps_its_gpus_usable_on_their_own_and_uncordon_undoes_it():
    control = fold(act(NodeAction.CORDON))
    assert control.cordoned and not control.draining and control.usable(0) and control.reason == "why"
    assert not fold(act(NodeAction.CORDON), act(NodeAction.UNCORDON)).cordoned


def test_a_drain_is_a_cordon_that_drains():
    control = fold(act(NodeAction.DRAIN))
    assert control.cordoned and control.draining
    gpu = fold(act(NodeAction.DRAIN, gpu=1))
    assert not gpu.cordoned and gpu.gpu(1).cordoned and gpu.gpu(1).draining and not gpu.usable(1)


def test_an_unhealthy_mark_stays_until_an_uncordon_of_the_gpu_or_the_node():
    assert fold(BROKEN).unhealthy == {2: "GPU lost"} and not fold(BROKEN).usable(2)
    assert fold(BROKEN, act(NodeAction.CORDON), act(NodeAction.UNCORDON, gpu=1)).unhealthy == {2: "GPU lost"}
    assert fold(BROKEN, act(NodeAction.UNCORDON, gpu=2)).unhealthy == {}
    assert fold(BROKEN, act(NodeAction.UNCORDON)).unhealthy == {}


def test_uncordoning_one_gpu_leaves_the_node_cordon():
    control = fold(act(NodeAction.CORDON), act(NodeAction.CORDON, gpu=0), act(NodeAction.UNCORDON, gpu=0))
    assert control.cordoned and control.usable(0) and control.gpus == {}


def test_the_first_mark_keeps_its_time():
    first = make_event(BROKEN, source="/test")
    control = apply(NodeControl(node="n"), first)
    again = apply(control, make_event(BROKEN.model_copy(update={"reason": "xid"}), source="/test"))
    assert again.gpu(2).unhealthy_since == first.time


def test_the_projection_reads_back_as_it_was_written():
    control = fold(BROKEN, act(NodeAction.DRAIN, gpu=1))
    assert NodeControl.model_validate(control.model_dump(mode="json")) == control
