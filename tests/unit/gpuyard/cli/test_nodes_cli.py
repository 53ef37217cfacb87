"""`gpuyard nodes` and `gpuyard nodes cordon|drain|uncordon NODE[/GPU]` through the real client against the real
API (in process): the target's parsing, the admin check, and what the listing shows."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from gpuyard import cli
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuInfo, GpuReading, GpuSample, NodeHeartbeat
from tests.unit.services.submit.test_submit_api import api, ctx  # noqa: F401 (fixtures)

GIB = 1 << 30


@pytest.fixture
def gpuyard(api, ctx, monkeypatch, capsys):  # noqa: F811
    """Run `gpuyard ARGS` with a token, against the app (node-1 with two GPUs announced and sampled)."""
    monkeypatch.setattr(
        "gpuyard.client.httpx.Client",
        lambda base_url, headers, timeout: TestClient(api.app, base_url=base_url, headers=headers),
    )
    hb = NodeHeartbeat(
        node="node-1",
        gpus=[GpuInfo(index=i, uuid=f"GPU-{i}", model="H100", memory_bytes=80 * GIB) for i in range(2)],
        cpus=16,
        memory_bytes=64 * GIB,
    )
    ctx.telemetry.observe(make_event(hb, source="/executor"))
    holder = GpuHolder(job_id="job-1", tenant="vision", user="ana")
    sample = GpuSample(
        node="node-1",
        gpus=[
            GpuReading(
                index=0, uuid="GPU-0", utilization_pct=87.0, memory_used_bytes=10 * GIB, holders=[holder]
            ),
            GpuReading(index=1, uuid="GPU-1", utilization_pct=0.0, memory_used_bytes=0),
        ],
    )
    ctx.telemetry.observe(make_event(sample, source="/monitor", time=None))

    def run(*args: str, token: str = "tok-admin") -> tuple[int, str, str]:
        code = cli.main([*args, "--server", "http://testserver", "--token", token])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.mark.parametrize(
    ("target", "expected"),
    [("node-a", ("node-a", None)), ("node-a/1", ("node-a", 1)), ("n.b/12", ("n.b", 12))],
)
def test_a_target_is_a_node_or_one_gpu_of_it(target, expected):
    assert cli.nodes.parse_node_target(target) == expected


@pytest.mark.parametrize("target", ["/1", "node-a/", "node-a/x", "node-a/-1"])
def test_a_bad_target_is_a_clear_error(target):
    with pytest.raises(cli.common.CliError, match="NODE/GPU|index"):
        cli.nodes.parse_node_target(target)


def test_cordon_a_gpu_then_the_listing_shows_it_and_uncordon_undoes_it(gpuyard):
    code, out, _ = gpuyard("nodes", "cordon", "node-1/1", "--reason", "fan")
    assert code == 0 and "GPU 1 of node node-1 cordoned" in out
    code, out, _ = gpuyard("nodes", "--json")
    [node] = json.loads(out)
    assert node["state"] == "ready" and [g["cordoned"] for g in node["gpus"]] == [False, True]
    assert node["gpus"][0]["utilization_pct"] == 87.0
    code, out, _ = gpuyard("nodes")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["NODE", "STATE", "GPU", "MODEL", "HEALTH"]
    assert "node-1" in lines[1] and "ready" in lines[1] and "87%" in lines[1] and "job-1" in lines[1]
    assert "cordoned" in lines[2] and "0%" in lines[2]
    assert gpuyard("nodes", "uncordon", "node-1/1")[0] == 0
    [node] = json.loads(gpuyard("nodes", "--json")[1])
    assert not any(g["cordoned"] for g in node["gpus"])


def test_drain_a_node_shows_draining(gpuyard):
    code, out, _ = gpuyard("nodes", "drain", "node-1")
    assert code == 0 and "node node-1 drained" in out and "requeued" in out
    assert "draining" in gpuyard("nodes")[1]


def test_a_tenant_cannot_cordon_and_is_told_why(gpuyard):
    code, _, err = gpuyard("nodes", "cordon", "node-1", token="tok-vision")
    assert code == 1 and "admin" in err
    code, _, err = gpuyard("nodes", "cordon", "node-1/x")
    assert code == 1 and "index" in err
    code, _, err = gpuyard("nodes", "cordon", "node-7")
    assert code == 1 and "no node 'node-7'" in err


def test_the_listing_says_what_the_nodes_engine_says_of_it(gpuyard, ctx):  # noqa: F811
    note = "1 GPU(s) held by Slurm jobs outside GPUYARD: 4711 (1)"
    hb = NodeHeartbeat(node="slurm-1", gpus=[], cpus=8, memory_bytes=GIB, notes=[note])
    ctx.telemetry.observe(make_event(hb, source="/executor"))
    code, out, _ = gpuyard("nodes")
    assert code == 0 and f"slurm-1: {note}" in out.splitlines()
    listed = {n["node"]: n["notes"] for n in json.loads(gpuyard("nodes", "--json")[1])}
    assert listed == {"node-1": [], "slurm-1": [note]}
