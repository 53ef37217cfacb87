"""`gpuyard alerts` through the real client against the real API (in process): a table of severity, since,
subject and message, the JSON form, and each tenant's own alerts."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient

from gpuyard import cli
from gpuyard.shared.contracts.events.alerts import AlertRaised, AlertResolved
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.stores.readmodels.alertbook import AlertBook
from tests.unit.services.submit.test_submit_api import api, ctx  # noqa: F401 (fixtures)


@pytest.fixture
def gpuyard(api, ctx, monkeypatch, capsys):  # noqa: F811
    """Run `gpuyard ARGS` with a token, against the app; its exit status and output."""
    monkeypatch.setattr(
        "gpuyard.client.httpx.Client",
        lambda base_url, headers, timeout: TestClient(api.app, base_url=base_url, headers=headers),
    )
    now = datetime.now(UTC)

    async def record():
        book = AlertBook(ctx.store)
        hot = AlertRaised(
            alert_id="gpu_temperature/node-1/3", kind="gpu_temperature", severity="critical",
            message="GPU 3 on node-1 at 91 °C", node="node-1", gpu_index=3, value=91, threshold=85,
        )  # fmt: skip
        waiting = AlertRaised(
            alert_id="job_waiting/j1", kind="job_waiting", message="job j1 (train) has waited 45m",
            job_id="j1", tenant="vision", user="ana",
        )  # fmt: skip
        await book.record(make_event(hot, source="/t", time=now - timedelta(minutes=12)))
        await book.record(make_event(waiting, source="/t", time=now - timedelta(minutes=50)))
        resolved = AlertResolved(
            alert_id="job_waiting/j1", kind="job_waiting", message="placed", tenant="vision"
        )
        await book.record(make_event(resolved, source="/t", time=now - timedelta(minutes=2)))

    asyncio.run(record())

    def run(*args: str, token: str = "tok-admin") -> tuple[int, str]:
        code = cli.main([*args, "--server", "http://testserver", "--token", token])
        return code, capsys.readouterr().out

    return run


def test_alerts_lists_the_active_ones_with_severity_since_subject_and_message(gpuyard):
    code, out = gpuyard("alerts")
    assert code == 0
    header, row = out.strip().splitlines()
    assert header.split() == ["SEVERITY", "SINCE", "SUBJECT", "MESSAGE"]
    cols = row.split()
    assert re.fullmatch(r"12m(0\ds)?", cols[1]), (
        cols
    )  # (raised 12 min before the command ran: 12m, or 12m01s)
    assert cols[:1] + cols[2:7] == ["critical", "ago", "node-1", "GPU", "3", "GPU"]
    assert "at 91 °C" in row and "job_waiting" not in out


def test_alerts_all_shows_the_resolved_ones_and_when(gpuyard):
    code, out = gpuyard("alerts", "--all")
    lines = out.strip().splitlines()
    assert code == 0 and lines[0].split()[-1] == "RESOLVED" and len(lines) == 3
    assert (
        "job j1 (vision)" in lines[2]
        and re.search(r" 2m(0\ds)? ago$", lines[2].rstrip())
        and "active" in lines[1]
    )


def test_alerts_json_and_kind_and_a_tenants_own(gpuyard):
    code, out = gpuyard("alerts", "--all", "--kind", "job_waiting", "--json")
    [alert] = json.loads(out)
    assert code == 0 and alert["alert_id"] == "job_waiting/j1" and alert["state"] == "resolved"
    code, out = gpuyard("alerts", "--all", "--json", token="tok-nlp")
    assert code == 0 and json.loads(out) == []
    code, out = gpuyard("alerts", token="tok-vision")
    assert code == 0 and out.strip() == "no alerts active (use --all to see resolved ones)"
    code, out = gpuyard("alerts", "--all", token="tok-vision")
    assert "job j1 (vision)" in out and "resolved" not in out.split()[0]


def test_alerts_for_another_tenant_is_one_line_and_exit_1(gpuyard, capsys):
    code = cli.main(["alerts", "--tenant", "nlp", "--server", "http://testserver", "--token", "tok-vision"])
    assert code == 1 and "your token is for tenant 'vision'" in capsys.readouterr().err
