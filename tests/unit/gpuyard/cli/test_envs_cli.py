"""`gpuyard envs` and `gpuyard envs rm KEY [--node N]` through the real client against the real API (in
process); and `environment: {requirements: requirements.txt}` read beside the spec file into `pip`."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient

from gpuyard import cli
from gpuyard.cli.envs import with_requirements
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.nodes import NodeEnvironment, NodeHeartbeat
from gpuyard.shared.contracts.specfiles import SpecError
from tests.unit.services.submit.test_submit_api import api, ctx  # noqa: F401 (fixtures)

KEY = "4efa2a5733994b927bf7"


class Published:
    def __init__(self) -> None:
        self.events = []

    async def publish(self, event, *, tenant=None, version=None):
        self.events.append(event)


@pytest.fixture
def gpuyard(api, ctx, monkeypatch, capsys):  # noqa: F811
    monkeypatch.setattr(
        "gpuyard.client.httpx.Client",
        lambda base_url, headers, timeout: TestClient(api.app, base_url=base_url, headers=headers),
    )
    env = NodeEnvironment(
        key=KEY, python="3.11", packages="numpy, tinypkg", package_count=2, size_bytes=3 * 10**6,
        last_used=datetime.now(UTC), in_use=1,
    )  # fmt: skip
    hb = NodeHeartbeat(
        node="node-1", gpus=[], cpus=4, memory_bytes=1 << 30, pythons=["3.11"], environments=[env]
    )
    ctx.telemetry.observe(make_event(hb, source="/executor"))
    ctx.bus = Published()

    def run(*args: str, token: str = "tok-admin") -> tuple[int, str, str]:
        code = cli.main([*args, "--server", "http://testserver", "--token", token])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


def test_envs_lists_what_each_node_holds_and_offers(gpuyard):
    code, out, _ = gpuyard("envs", token="tok-vision")
    assert code == 0
    assert KEY in out and "node-1" in out and "numpy, tinypkg" in out and "3 MB" in out
    assert "python versions offered: node-1: 3.11" in out
    code, out, _ = gpuyard("envs", "--json", token="tok-vision")
    assert json.loads(out)["items"][0]["key"] == KEY
    assert "no job environments on node other" in gpuyard("envs", "--node", "other")[1]


def test_envs_rm_is_refused_in_use_and_to_a_tenant(gpuyard):
    code, _, err = gpuyard("envs", "rm", KEY)
    assert code == 1 and "in use by running jobs: node-1 (1 replica)" in err
    code, _, err = gpuyard("envs", "rm", KEY, token="tok-vision")
    assert code == 1 and "error:" in err


def test_requirements_are_read_beside_the_spec_file_into_pip(tmp_path):
    (tmp_path / "requirements.txt").write_text("# pinned\ntorch==2.13.0  # the CPU build\n\nnumpy>=1.26\n")
    spec = {"command": "x", "environment": {"requirements": "requirements.txt", "python": "3.11"}}
    read = with_requirements(spec, tmp_path / "job.yaml")
    assert read["environment"] == {"python": "3.11", "pip": ["torch==2.13.0", "numpy>=1.26"]}
    assert with_requirements({"command": "x"}, tmp_path / "job.yaml") == {"command": "x"}
    (tmp_path / "opts.txt").write_text("numpy\n--index-url https://elsewhere\n")
    with pytest.raises(SpecError, match=r"opts\.txt, line 2: options are not taken \(--index-url\)"):
        with_requirements({"environment": {"requirements": "opts.txt"}}, tmp_path / "job.yaml")
    with pytest.raises(SpecError, match="cannot read environment.requirements"):
        with_requirements({"environment": {"requirements": "missing.txt"}}, tmp_path / "job.yaml")
