"""`/v1/environments`: what the nodes' heartbeats say they hold, to every tenant; an admin's removal sent to
the nodes that hold it as `node.environment_remove`, refused while a running replica uses it."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import EnvironmentRemoveRequested, NodeEnvironment
from tests.unit.services.submit.test_submit_api import ADMIN, VISION, api, ctx  # noqa: F401 (fixtures)
from tests.unit.services.submit.test_unplaceable import node


class Published:
    def __init__(self) -> None:
        self.events = []

    async def publish(self, event, *, tenant=None, version=None):
        self.events.append(event)


def holding(name: str, *envs: NodeEnvironment, pythons=("3.11",)):
    return node(name, 1).model_copy(update={"pythons": list(pythons), "environments": list(envs)})


def env(key: str, in_use: int = 0, size: int = 1000) -> NodeEnvironment:
    return NodeEnvironment(
        key=key,
        python="3.11",
        packages="numpy",
        package_count=1,
        size_bytes=size,
        last_used=datetime.now(UTC),
        in_use=in_use,
    )


def test_every_tenant_sees_what_each_node_holds_and_offers(api, ctx):  # noqa: F811
    ctx.telemetry.observe(make_event(holding("a", env("aa11")), source="/test"))
    ctx.telemetry.observe(
        make_event(holding("b", env("aa11"), env("bb22", in_use=2), pythons=()), source="/test")
    )
    listed = api.get("/v1/environments", headers=VISION).json()
    assert sorted((e["node"], e["key"], e["in_use"]) for e in listed["items"]) == [
        ("a", "aa11", 0),
        ("b", "aa11", 0),
        ("b", "bb22", 2),
    ]
    assert listed["nodes"] == [{"node": "a", "pythons": ["3.11"]}, {"node": "b", "pythons": []}]
    one = api.get("/v1/environments", params={"node": "b"}, headers=VISION).json()
    assert {e["node"] for e in one["items"]} == {"b"} and [n["node"] for n in one["nodes"]] == ["b"]
    assert api.get("/v1/environments").status_code == 401


def test_an_admin_removes_one_from_the_nodes_that_hold_it(api, ctx):  # noqa: F811
    ctx.bus = Published()
    ctx.telemetry.observe(make_event(holding("a", env("aa11", size=5)), source="/test"))
    ctx.telemetry.observe(
        make_event(holding("b", env("aa11", size=7), env("bb22", in_use=1)), source="/test")
    )
    assert api.delete("/v1/environments/aa11", headers=VISION).status_code == 403
    removed = api.delete("/v1/environments/aa11", headers=ADMIN)
    assert removed.status_code == 202 and removed.json() == {
        "key": "aa11",
        "nodes": ["a", "b"],
        "size_bytes": 12,
    }
    sent = [e.data for e in ctx.bus.events]
    assert sent == [
        EnvironmentRemoveRequested(node="a", key="aa11", by=sent[0].by),
        EnvironmentRemoveRequested(node="b", key="aa11", by=sent[0].by),
    ]
    only_b = api.delete("/v1/environments/aa11", params={"node": "b"}, headers=ADMIN)
    assert only_b.json()["nodes"] == ["b"]
    busy = api.delete("/v1/environments/bb22", headers=ADMIN)
    assert busy.status_code == 409 and "in use by running jobs: b (1 replica)" in busy.json()["detail"]
    missing = api.delete("/v1/environments/cc33", headers=ADMIN)
    assert missing.status_code == 404 and "holds environment cc33" in missing.json()["detail"]
    assert api.delete("/v1/environments/NOT-A-KEY", headers=ADMIN).status_code == 422


def test_without_the_bus_a_removal_is_a_503(api, ctx):  # noqa: F811
    ctx.bus = None
    ctx.telemetry.observe(make_event(holding("a", env("aa11")), source="/test"))
    assert api.delete("/v1/environments/aa11", headers=ADMIN).status_code == 503
