"""`gpuyard usage` and `gpuyard top --once` through the real client against the real API (in process), and
`GET /v1/nodes` with each GPU's latest sample (the submit service's telemetry)."""

from __future__ import annotations

import csv
import io
import json
import time
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from rich.console import Console

from gpuyard import cli
from gpuyard.client import ClientError
from gpuyard.shared.contracts.api.nodes import GpuOut, NodeOut
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import GpuHolder, GpuInfo, GpuReading, GpuSample, NodeHeartbeat
from gpuyard.top import run_top
from tests.unit.services.submit.test_submit_api import api, ctx  # noqa: F401 (fixtures)
from tests.unit.shared.reporting.test_usage_api import two_tenants_ran  # noqa: F401 (fixture)

GIB = 1 << 30


@pytest.fixture
def gpuyard(api, monkeypatch, capsys):  # noqa: F811
    """Run `gpuyard ARGS` with a token, against the app; its exit status and output."""
    monkeypatch.setattr(
        "gpuyard.client.httpx.Client",
        lambda base_url, headers, timeout: TestClient(api.app, base_url=base_url, headers=headers),
    )

    def run(*args: str, token: str = "tok-admin") -> tuple[int, str]:
        code = cli.main([*args, "--server", "http://testserver", "--token", token])
        return code, capsys.readouterr().out

    return run


def test_usage_csv_has_allocated_used_and_waste_side_by_side(gpuyard, two_tenants_ran):  # noqa: F811
    hours = two_tenants_ran
    code, out = gpuyard("usage", "--since", "2h", "--by", "job", "--csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    by_job = {r["job_id"]: r for r in rows}
    assert set(by_job) == {"job-vis", "job-nlp"}
    vis = by_job["job-vis"]
    assert (vis["tenant"], vis["user"], vis["jobs"]) == ("vision", "ana", "1")
    allocated, used, waste = (
        float(vis[k]) for k in ("allocated_gpu_hours", "used_gpu_hours", "waste_gpu_hours")
    )
    assert allocated == pytest.approx(hours, rel=1e-3) and used == pytest.approx(0.8 * hours, rel=1e-3)
    assert waste == pytest.approx(allocated - used, abs=1e-5)
    code, out = gpuyard("usage", "--since", "2h", "--csv", token="tok-vision")  # its own tenant only
    assert [r["tenant"] for r in csv.DictReader(io.StringIO(out))] == ["vision"]


def test_usage_table_and_json(gpuyard, two_tenants_ran):  # noqa: F811
    code, out = gpuyard("usage", "--since", "2h")
    assert code == 0
    lines = out.strip().splitlines()
    assert lines[0].startswith("GPU-hours from ")
    assert lines[1].split() == ["TENANT", "JOBS", "ALLOCATED", "USED", "WASTE", "USED", "%"]
    assert lines[2].split()[0] == "nlp" and lines[3].split()[0] == "vision" and lines[3].split()[-1] == "80%"
    code, out = gpuyard("usage", "--since", "2h", "--by", "user", "--json")
    assert {(r["tenant"], r["user"]) for r in json.loads(out)["rows"]} == {("vision", "ana"), ("nlp", "bo")}
    assert gpuyard("usage", "--since", "soon")[0] == 1


def heard(ctx, *, with_sample: bool) -> None:  # noqa: F811
    """node-1 with two GPUs: GPU 0 held by vision's job at 90 %, GPU 1 free."""
    gpus = [GpuInfo(index=i, uuid=f"GPU-{i}", model="SIM-GPU", memory_bytes=16 * GIB) for i in (0, 1)]
    ctx.telemetry.observe(
        make_event(NodeHeartbeat(node="node-1", gpus=gpus, cpus=8, memory_bytes=GIB), source="/t")
    )
    if not with_sample:
        return
    holder = GpuHolder(job_id="job-vis", tenant="vision", user="ana", fraction=0.5)
    sample = GpuSample(
        node="node-1",
        gpus=[
            GpuReading(
                index=0, uuid="GPU-0", utilization_pct=90.0, memory_used_bytes=8 * GIB, holders=[holder]
            ),
            GpuReading(index=1, uuid="GPU-1", utilization_pct=0.0, memory_used_bytes=0),
        ],
    )
    ctx.telemetry.observe(make_event(sample, source="/t"))


def test_top_once_shows_each_gpu_with_its_bar_memory_and_holder(gpuyard, ctx):  # noqa: F811
    heard(ctx, with_sample=True)
    code, out = gpuyard("top", "--once")
    assert code == 0
    headline, header, first, second = out.strip().splitlines()
    assert "1 node(s), 2 GPU(s): 1 held, 1 busy" in headline
    assert header.split() == ["NODE", "GPU", "MODEL", "UTILIZATION", "MEMORY", "HOLDER"]
    assert first.split()[:3] == ["node-1", "0", "SIM-GPU"] and "90%" in first and "8 GiB / 16 GiB" in first
    assert "job-vis (vision/ana) ×0.5" in first and "█" * 18 in first
    assert second.split()[:2] == ["1", "SIM-GPU"] and " 0%" in second and first.index("█") > 0
    code, out = gpuyard("top", "--once", token="tok-nlp")  # another tenant's job: only `other`
    assert "other ×0.5" in out and "job-vis" not in out and "vision" not in out


def test_top_says_when_a_node_has_no_fresh_sample(gpuyard, ctx):  # noqa: F811
    heard(ctx, with_sample=False)
    code, out = gpuyard("top", "--once")
    assert code == 0 and out.count("no sample") == 2
    nodes = json.loads(gpuyard("top", "--json")[1])
    assert nodes[0]["sampled_seconds_ago"] is None and nodes[0]["gpus"][0]["utilization_pct"] is None


def test_a_stale_sample_is_not_shown(ctx):  # noqa: F811
    heard(ctx, with_sample=True)
    assert ctx.telemetry.latest_sample("node-1") is not None
    assert ctx.telemetry.latest_sample("node-1", now=time.time() + 60) is None
    old = GpuSample(node="node-1", gpus=[])
    ctx.telemetry.observe(make_event(old, source="/t", time=datetime.now(UTC) - timedelta(minutes=1)))
    assert len(ctx.telemetry.latest_sample("node-1")[1].gpus) == 2  # an older sample changes nothing


def test_describe_shows_the_jobs_mean_gpu_utilization_over_its_run(gpuyard, two_tenants_ran):  # noqa: F811
    code, out = gpuyard("describe", "job-vis", token="tok-vision")
    assert code == 0
    [line] = [line for line in out.splitlines() if line.startswith("GPU use")]
    assert "80% mean utilization over its run" in line and "0.40 of 0.50 GPU-hours used" in line


def test_top_refreshes_in_place_and_rides_out_an_api_away_for_a_moment(monkeypatch):
    answers = iter([10.0, ClientError("cannot reach the API"), 30.0, KeyboardInterrupt()])

    class Nodes:
        def nodes(self):
            answer = next(answers)
            if isinstance(answer, BaseException):
                raise answer
            gpu = GpuOut(index=0, uuid="G", model="M", memory_bytes=GIB, utilization_pct=answer)
            return [
                NodeOut(
                    node="a",
                    state="ready",
                    last_seen_seconds_ago=1,
                    gpus=[gpu],
                    cpus=1,
                    memory_bytes=1,
                    simulated=True,
                )
            ]

    monkeypatch.setattr("gpuyard.top.time.sleep", lambda _: None)
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with pytest.raises(KeyboardInterrupt):
        run_top(Nodes(), console, interval=1, once=False)
    shown = console.file.getvalue()
    assert shown.index(" 10%") < shown.index("cannot reach the API (trying again)") < shown.index(" 30%")
    assert "\x1b[1A" in shown  # the cursor goes back up: the frame is redrawn in place


def test_usage_with_volumes_shows_the_tenants_volumes_their_use_and_quota(gpuyard, api):  # noqa: F811
    vision = {"Authorization": "Bearer tok-vision"}
    assert api.post("/v1/volumes", json={"name": "images", "size": "8MB"}, headers=vision).status_code == 201
    assert api.post("/v1/volumes", json={"name": "empty", "size": 1000}, headers=vision).status_code == 201
    put = api.put(
        "/v1/volumes/images/content", params={"path": "a.bin"}, content=b"x" * 2_000_000, headers=vision
    )
    assert put.status_code == 201, put.text
    code, out = gpuyard("usage", "--volumes", token="tok-vision")
    assert code == 0
    lines = out.strip().splitlines()
    at = lines.index("Volumes of tenant vision")
    assert lines[at + 1].split() == ["VOLUME", "SIZE", "USED", "USED", "%"]
    assert lines[at + 2].split() == ["images", "8", "MB", "2", "MB", "25%"]
    assert lines[at + 3].split() == ["empty", "1", "kB", "0", "B", "0%"]
    assert lines[at + 4] == "2 volume(s) reserve 8001 kB (no volume quota); their files hold 2 MB"


def test_usage_with_volumes_as_json_and_for_another_tenant(gpuyard, api):  # noqa: F811
    nlp = {"Authorization": "Bearer tok-nlp"}
    assert api.post("/v1/volumes", json={"name": "corpus", "size": 3000}, headers=nlp).status_code == 201
    code, out = gpuyard("usage", "--volumes", "--json", token="tok-nlp")
    assert code == 0
    answer = json.loads(out)
    assert set(answer) == {"gpu", "volumes"} and "rows" in answer["gpu"]
    [corpus] = answer["volumes"]["items"]
    assert (corpus["name"], corpus["size_bytes"], corpus["used_bytes"]) == ("corpus", 3000, 0)
    assert (answer["volumes"]["reserved_bytes"], answer["volumes"]["quota_bytes"]) == (3000, 0)
    code, out = gpuyard("usage", "--volumes", "--tenant", "nlp")  # an admin names the tenant
    assert code == 0 and "Volumes of tenant nlp" in out and "corpus" in out
    code, out = gpuyard("usage", "--volumes")  # an admin's own tenant: none
    assert code == 0 and "no volumes (no volume quota)" in out
    assert "rows" in json.loads(gpuyard("usage", "--json")[1])  # without --volumes: as before
    assert gpuyard("usage", "--volumes", "--csv")[0] == 1
