"""The alert engine, rule by rule: each alert raised after its `for`, resolved after its `keep_firing_for`, and
not flapping when a figure hovers around a threshold. Fed samples and jobs directly, with times."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpuyard.services.monitor.alerts import STALE_SECONDS, ActiveAlert, Engine, JobSnapshot, Raise, Resolve
from gpuyard.services.monitor.rules import parse_rules
from gpuyard.shared.contracts.events.alerts import AlertRaised
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuReading, GpuSample

T0 = datetime(2026, 11, 27, 10, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def gpu(
    index: int = 0,
    *,
    util: float = 50,
    temp: float = 60,
    power: float = 200,
    limit: float = 300,
    ecc: int = 0,
    xids: tuple[int, ...] = (),
    lost: bool = False,
    jobs: tuple[str, ...] = (),
) -> GpuReading:
    return GpuReading(
        index=index, uuid=f"GPU-{index}", utilization_pct=util, memory_used_bytes=0, memory_total_bytes=1,
        temperature_c=temp, power_w=power, power_limit_w=limit, ecc_uncorrected=ecc, xids=list(xids),
        lost=lost, holders=[GpuHolder(job_id=j, tenant="vision", user="ana") for j in jobs],
    )  # fmt: skip


def sample(*gpus: GpuReading, node: str = "node-1") -> GpuSample:
    return GpuSample(node=node, gpus=list(gpus))


def feed(engine: Engine, readings: list[tuple[float, GpuReading]], node: str = "node-1"):
    """Each reading as its node's sample at its time; the changes, each with its time."""
    out = []
    for t, reading in readings:
        out += [(t, c) for c in engine.sample(sample(reading, node=node), at(t))]
    return out


def raised(changes):
    return [(t, c.data.alert_id) for t, c in changes if isinstance(c, Raise)]


def resolved(changes):
    return [(t, c.data.alert_id) for t, c in changes if isinstance(c, Resolve)]


def test_temperature_is_raised_after_for_and_resolved_after_keep_firing_for():
    engine = Engine()  # 85 °C for 1m raises, under 80 °C for 1m resolves
    hot = [(t, gpu(temp=90)) for t in range(0, 70, 10)]
    changes = feed(engine, [(-10, gpu(temp=60)), *hot])
    assert raised(changes) == [(60, "gpu_temperature/node-1/0")]
    [(_, alert)] = [(t, c) for t, c in changes if isinstance(c, Raise)]
    assert alert.data.severity == "warning" and alert.data.value == 90 and alert.data.threshold == 85
    assert alert.data.node == "node-1" and alert.data.gpu_index == 0 and alert.data.tenant is None
    assert "90 °C" in alert.data.message
    cool = feed(engine, [(t, gpu(temp=70)) for t in range(70, 140, 10)])
    assert resolved(cool) == [(130, "gpu_temperature/node-1/0")]
    assert cool[0][1].raised_id == alert.event_id and cool[0][1].data.message == "the GPU cooled down"


def test_temperature_hovering_around_a_threshold_does_not_flap():
    engine = Engine()
    # 84..86 °C around the raise threshold: pending starts over at each 84, never held for a minute
    hovering = [(t, gpu(temp=86 if (t // 10) % 2 else 84)) for t in range(0, 600, 10)]
    assert feed(engine, hovering) == []
    # raised, then hovering around 80 °C (the clear threshold): the dead band keeps it raised
    changes = feed(engine, [(t, gpu(temp=90)) for t in range(600, 670, 10)])
    assert len(raised(changes)) == 1
    around = [(t, gpu(temp=79 if (t // 10) % 2 else 81)) for t in range(670, 1500, 10)]
    assert feed(engine, around) == []
    assert engine.active() == ["gpu_temperature/node-1/0"]


def test_a_redelivered_sample_changes_nothing_and_ids_are_derived():
    one, two = Engine(), Engine()
    readings = [(t, gpu(temp=95)) for t in range(0, 70, 10)]
    first = feed(one, readings)
    assert feed(one, readings[2:4]) == []  # older than what it saw
    again = feed(two, readings)  # another engine, the same observations: the same events
    assert [c.event_id for _, c in first] == [c.event_id for _, c in again] and len(first) == 1


def test_power_over_a_fraction_of_the_limit_or_over_watts():
    engine = Engine(parse_rules({"rules": {"gpu_power": {"for": "30s", "keep_firing_for": 0}}}))
    changes = feed(engine, [(t, gpu(power=305, limit=300)) for t in range(0, 40, 10)])
    assert raised(changes) == [(30, "gpu_power/node-1/0")]
    assert feed(engine, [(40, gpu(power=290, limit=300))]) == []  # 96.7 %: in the band
    assert resolved(feed(engine, [(50, gpu(power=200, limit=300))])) == [(50, "gpu_power/node-1/0")]
    watts = Engine(
        parse_rules({"rules": {"gpu_power": {"for": 0, "above_watts": 250, "clear_below_watts": 200}}})
    )
    [(_, alert)] = feed(watts, [(0, gpu(power=260, limit=700))])
    assert alert.data.threshold == 250 and "250 W" in alert.data.message


def test_a_fatal_xid_is_critical_at_once_and_an_application_xid_is_the_jobs():
    engine = Engine()
    changes = feed(engine, [(0, gpu(xids=(79,), jobs=("j1",))), (1, gpu(xids=(13,), jobs=("j1",)))])
    by_id = {c.data.alert_id: c.data for _, c in changes}
    assert set(by_id) == {"gpu_xid/node-1/0", "job_xid/node-1/0/j1"}
    assert by_id["gpu_xid/node-1/0"].severity == "critical" and by_id["gpu_xid/node-1/0"].tenant is None
    app = by_id["job_xid/node-1/0/j1"]
    assert app.severity == "warning" and app.tenant == "vision" and app.job_id == "j1" and app.value == 13
    quiet = [(t, gpu(jobs=("j1",))) for t in range(2, 3700, 60)]
    ends = resolved(feed(engine, quiet))
    assert [a for _, a in ends] == ["job_xid/node-1/0/j1", "gpu_xid/node-1/0"]  # 15 min, then 1 h
    assert 900 <= ends[0][0] < 1000 and 3600 <= ends[1][0] < 3700


def test_uncorrectable_ecc_and_a_lost_gpu_are_raised_at_once_and_resolved_when_back():
    engine = Engine()
    changes = feed(engine, [(0, gpu(ecc=2)), (1, gpu(ecc=2, lost=True))])
    assert raised(changes) == [(0, "gpu_ecc/node-1/0"), (1, "gpu_lost/node-1/0")]
    back = feed(engine, [(t, gpu()) for t in range(2, 80, 5)])
    assert resolved(back) == [(2, "gpu_ecc/node-1/0"), (62, "gpu_lost/node-1/0")]


def test_an_allocated_gpu_idle_in_every_sample_is_raised_for_its_job():
    engine = Engine(parse_rules({"rules": {"gpu_idle": {"for": "5m"}}}))
    assert feed(engine, [(t, gpu(util=0)) for t in range(0, 900, 30)]) == []  # nobody holds it
    # one sample at 7 % (under the clear threshold, over the idle one) starts the window over
    window = [(t, gpu(util=7 if t == 120 else 1, jobs=("j1",))) for t in range(0, 600, 30)]
    changes = feed(engine, window)
    assert raised(changes) == [(450, "gpu_idle/node-1/0/j1")]
    alert = changes[0][1].data
    assert alert.tenant == "vision" and alert.user == "ana" and alert.job_id == "j1" and alert.threshold == 5
    assert feed(engine, [(600, gpu(util=8, jobs=("j1",)))]) == []  # the band: still idle
    assert resolved(feed(engine, [(630, gpu(util=40, jobs=("j1",)))])) == [(630, "gpu_idle/node-1/0/j1")]
    feed(engine, [(t, gpu(util=0, jobs=("j1",))) for t in range(660, 1000, 30)])
    gone = feed(engine, [(1000, gpu(util=0))])  # the job let the GPU go
    assert resolved(gone) == [(1000, "gpu_idle/node-1/0/j1")]
    assert gone[0][1].data.message == "the job let the GPU go" and gone[0][1].data.tenant == "vision"


def test_a_held_gpu_that_reports_no_utilization_is_raised_lost_and_its_idle_alert_ends():
    """A GPU lost while a job holds it reports no utilization: it neither counts as activity nor as idle."""
    engine = Engine(parse_rules({"rules": {"gpu_idle": {"for": "5m"}}}))
    idle = feed(engine, [(t, gpu(util=0, jobs=("j1",))) for t in range(0, 330, 30)])
    assert raised(idle) == [(300, "gpu_idle/node-1/0/j1")]
    lost = GpuReading(
        index=0, uuid="GPU-0", lost=True, holders=[GpuHolder(job_id="j1", tenant="vision", user="ana")]
    )
    changes = feed(engine, [(330, lost)])
    assert raised(changes) == [(330, "gpu_lost/node-1/0")]
    assert resolved(changes) == [(330, "gpu_idle/node-1/0/j1")]


def test_a_node_lost_is_resolved_once_its_heartbeats_are_back_for_keep_firing_for():
    engine = Engine()
    [lost] = engine.node_lost("node-2", at(0), last_seen=at(-20))
    assert isinstance(lost, Raise) and lost.data.severity == "critical" and "20s" in lost.data.message
    assert engine.node_lost("node-2", at(1), last_seen=at(-20)) == []  # told again: still one alert
    assert engine.node_heartbeat("node-1", at(2)) == [] and engine.node_heartbeat("node-2", at(10)) == []
    assert engine.tick(at(30)) == []
    [back] = engine.tick(at(41))
    assert isinstance(back, Resolve) and back.data.alert_id == "node_lost/node-2"
    assert engine.tick(at(10_000)) == []


def queued(job_id: str, since: float) -> JobSnapshot:
    return JobSnapshot(job_id, "nlp", "bo", "train", at(since))


def test_a_job_waiting_longer_than_for_is_raised_and_resolved_once_placed():
    engine = Engine()  # 30 min
    assert engine.jobs([queued("j1", 0)], [], at(1700)) == []
    [alert] = engine.jobs([queued("j1", 0)], [], at(1815))
    assert alert.data.alert_id == "job_waiting/j1" and alert.data.tenant == "nlp" and alert.data.value == 30.2
    assert alert.since == at(0)  # its id names when it began to wait: the same for any monitor
    assert engine.jobs([queued("j1", 0)], [], at(1830)) == []
    [done] = engine.jobs([], [], at(1845))
    assert isinstance(done, Resolve) and done.data.tenant == "nlp"


def running(job_id: str, since: float, output: int) -> JobSnapshot:
    return JobSnapshot(job_id, "nlp", "bo", "train", at(since), output)


def test_a_running_job_with_no_output_and_no_gpu_activity_is_silent():
    engine = Engine(parse_rules({"rules": {"job_silent": {"for": "10m"}}}))
    assert engine.jobs([], [running("j1", 0, 100)], at(60)) == []
    assert engine.jobs([], [running("j1", 0, 200)], at(300)) == []  # it wrote: silent from 300
    assert engine.jobs([], [running("j1", 0, 200)], at(880)) == []
    # its GPU was busy at 850: silent from then
    engine.sample(sample(gpu(util=80, jobs=("j1",))), at(850))
    assert engine.jobs([], [running("j1", 0, 200)], at(1400)) == []
    [silent] = engine.jobs([], [running("j1", 0, 200)], at(1460))
    assert silent.data.alert_id == "job_silent/j1" and silent.data.value == 10.2
    [back] = engine.jobs([], [running("j1", 0, 300)], at(1500))
    assert isinstance(back, Resolve) and back.data.message == "the job shows signs of life again"


def test_a_restarted_engine_raises_no_active_alert_again_and_ends_what_is_no_longer_reported():
    first = Engine()
    [(_, alert)] = feed(first, [(t, gpu(temp=95)) for t in range(0, 70, 10)])
    [(_, node_alert)] = [(0, c) for c in first.node_lost("node-9", at(0))]
    restarted = Engine()
    restarted.restore([ActiveAlert(a.data, a.event_id, a.since) for a in (alert, node_alert)], at(100))
    assert feed(restarted, [(t, gpu(temp=95)) for t in range(100, 300, 10)]) == []  # still hot: no new raise
    [end] = resolved(feed(restarted, [(t, gpu(temp=60)) for t in range(300, 370, 10)]))
    assert end == (360, "gpu_temperature/node-1/0")
    assert restarted.tick(at(300 + STALE_SECONDS * 10)) == []  # a lost node stays lost until it is back


def test_a_node_whose_samples_stop_has_its_gpu_alerts_resolved_as_no_longer_reported():
    engine = Engine()
    feed(engine, [(t, gpu(temp=95)) for t in range(0, 70, 10)])
    assert engine.tick(at(60 + STALE_SECONDS - 1)) == []
    [end] = engine.tick(at(60 + STALE_SECONDS))
    assert end.data.message == "no longer reported"


@pytest.mark.parametrize("kind", ["gpu_temperature", "gpu_xid", "gpu_idle"])
def test_a_disabled_rule_raises_nothing(kind):
    engine = Engine(parse_rules({"rules": {kind: {"enabled": False, "for": 0}}}))
    readings = [(t, gpu(util=0, temp=99, xids=(79,), jobs=("j1",))) for t in range(0, 100, 10)]
    assert not [a for _, a in raised(feed(engine, readings)) if a.startswith(kind)]


def test_each_raise_names_the_rule_and_subject_and_its_event_ids_are_stable():
    engine = Engine()
    changes = feed(engine, [(0, gpu(ecc=1))])
    [(_, change)] = changes
    assert isinstance(change.data, AlertRaised) and change.data.kind == "gpu_ecc"
    other = Engine()
    assert feed(other, [(0, gpu(ecc=1))])[0][1].event_id == change.event_id


def test_a_restored_silent_job_stays_silent_until_a_sign_of_life():
    first = Engine(parse_rules({"rules": {"job_silent": {"for": "10m"}}}))
    first.jobs([], [running("j1", 0, 0)], at(0))
    [silent] = first.jobs([], [running("j1", 0, 0)], at(700))
    restarted = Engine(parse_rules({"rules": {"job_silent": {"for": "10m"}}}))
    restarted.restore([ActiveAlert(silent.data, silent.event_id, at(700))], at(800))
    assert (
        restarted.jobs([], [running("j1", 0, 0)], at(800)) == []
    )  # first sight after the restart: still silent
    assert restarted.jobs([], [running("j1", 0, 0)], at(900)) == []
    [back] = restarted.jobs([], [running("j1", 0, 50)], at(1000))
    assert isinstance(back, Resolve) and back.raised_id == silent.event_id
