"""`gpuyard admin backup` of a running platform, restored into a fresh data directory: the platform started
there has every job (same states) and every event (same ids), its tokens, and runs a job that was queued."""

from __future__ import annotations

import json

import pytest

from .conftest import Platform, wait_for

pytestmark = pytest.mark.integration


def everything(client) -> dict[str, tuple[str, list[str]]]:
    """Every job: its state and its events' ids, through the API."""
    jobs = client.jobs(limit=200).items
    return {j.job_id: (j.state, [e.event["id"] for e in client.events(j.job_id)]) for j in jobs}


def test_a_restored_data_dir_has_every_job_and_event_and_runs_what_was_queued(tmp_path):
    config = tmp_path / "config"
    grows = {"GPUYARD_ACCEPT_UNPLACEABLE": "true"}  # its 2-GPU job waits for the bigger machine it moves to
    old = Platform(tmp_path / "old", config, simulate_gpus=1, executors=1, env=grows).start()
    client = old.client()
    done = [
        client.submit({"name": f"done-{k}", "command": "echo hi", "resources": {"gpus": 1}}).job_id
        for k in range(3)
    ]
    for job in done:
        old.wait_state(job, {"succeeded"})
    failed = client.submit({"name": "fails", "command": "exit 3", "resources": {"gpus": 1}}).job_id
    old.wait_state(failed, {"failed"})
    waiting = client.submit({"name": "waits", "command": "echo ran", "resources": {"gpus": 2}}).job_id
    wait_for(lambda: client.job(waiting).pending, 15, what="a pending reason")  # 2 GPUs: not on 1

    archive = tmp_path / "platform.tar.gz"
    saved = old.cli("admin", "backup", str(archive), "--data-dir", str(old.data_dir), "--json")
    assert saved.returncode == 0, saved.stderr
    before = everything(client)
    assert json.loads(saved.stdout)["jobs"] == len(before) == 5
    token = json.loads((config / "config.json").read_text())["token"]
    assert old.stop() == 0

    new_dir = tmp_path / "new"
    refused = old.cli("admin", "restore", str(archive), "--data-dir", str(old.data_dir))
    assert refused.returncode == 1 and "not empty" in refused.stderr
    restored = old.cli("admin", "restore", str(archive), "--data-dir", str(new_dir))
    assert restored.returncode == 0, restored.stderr

    new = Platform(new_dir, config, simulate_gpus=2, executors=1).start()
    try:
        assert json.loads((config / "config.json").read_text())["token"] == token  # tokens.json came back
        client = new.client()
        after = everything(client)
        assert set(after) == set(before)
        for job, (state, ids) in before.items():
            if job != waiting:
                assert after[job] == (state, ids)
            assert after[job][1][: len(ids)] == ids  # every event, same ids, in order
        assert new.wait_state(waiting, {"succeeded"}, timeout=60).state == "succeeded"
        assert "ran" in client.logs(waiting)
        assert client.logs(done[0]).strip() == "hi"  # the output the API serves came back too
    finally:
        new.stop()
