"""`gpuyard artifacts JOB`: the job's kept outputs listed whole (a listing of the API per folder), a file or the
whole tree downloaded (unpacked into a folder), against the real submit API in process; errors are one line."""

from __future__ import annotations

import json
import os

import pytest
from fastapi.testclient import TestClient

from gpuyard import cli
from gpuyard.client import Client
from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.context import JobOutputs
from tests.unit.services.submit.submitctx import submit_context

SPEC = {"name": "train", "command": "python train.py", "resources": {"gpus": 1}}


@pytest.fixture
def platform(tmp_path, monkeypatch):
    """The CLI's client talks to the submit API in process, with vision's token; `platform["requests"]` holds
    each request's path and query."""
    seen: dict = {"requests": []}
    outputs = JobOutputs(tmp_path / "storage", lambda tenant: None)
    with submit_context(tmp_path / "api", job_outputs=outputs) as ctx, TestClient(create_app(ctx)) as api:

        class InProcess(Client):
            def __init__(self, server=None, token=None, timeout=30):
                super().__init__("http://testserver", "tok-vision")
                self.http = api
                self.http.headers["Authorization"] = "Bearer tok-vision"
                self.http.event_hooks["request"] = [
                    lambda r: seen["requests"].append((r.url.path, r.url.query.decode()))
                ]

        monkeypatch.setattr(cli.common, "Client", InProcess)
        job = api.post("/v1/jobs", json=SPEC, headers={"Authorization": "Bearer tok-vision"}).json()["job_id"]
        seen["job"] = job
        seen["top"] = tmp_path / "storage" / "outputs" / "vision" / job
        yield seen


def keep(top) -> None:
    """What the job wrote to its output folder: two files at the top, a folder of folders."""
    (top / "metrics" / "epoch-1").mkdir(parents=True)
    (top / "model.bin").write_bytes(b"w" * 2048)
    (top / "notes.txt").write_text("trained\n")
    (top / "metrics" / "loss.tsv").write_text("0\t1.5\n")
    (top / "metrics" / "epoch-1" / "acc.tsv").write_text("0.9\n")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_artifacts_lists_every_file_the_job_kept_folder_by_folder(platform, capsys):
    keep(platform["top"])
    code, out, err = run(capsys, "artifacts", platform["job"][:6])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["PATH", "SIZE", "MODIFIED"]
    assert [line.split()[0] for line in lines[1:-1]] == [
        "metrics/",
        "metrics/epoch-1/",
        "metrics/epoch-1/acc.tsv",
        "metrics/loss.tsv",
        "model.bin",
        "notes.txt",
    ]
    assert lines[-1].startswith("4 file(s), ")
    asked = [query for path, query in platform["requests"] if path.endswith("/artifacts")]
    assert sorted(asked) == ["path=", "path=metrics", "path=metrics%2Fepoch-1"]  # one listing per folder
    code, out, _ = run(capsys, "artifacts", platform["job"], "--json")
    listed = json.loads(out)
    assert code == 0 and not listed["truncated"] and len(listed["items"]) == 6


def test_a_job_that_kept_nothing_says_so(platform, capsys):
    code, out, _ = run(capsys, "artifacts", platform["job"])
    assert code == 0 and "kept no outputs" in out


def test_artifacts_download_fetches_the_whole_tree_or_one_file(platform, capsys, tmp_path, monkeypatch):
    keep(platform["top"])
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "artifacts", platform["job"], "--download")
    assert code == 0, err
    tree = tmp_path / f"{platform['job']}-outputs"
    assert f"-> {tree.name}" in out
    found = sorted(str(p.relative_to(tree)) for p in tree.rglob("*"))
    assert found == [
        "metrics",
        "metrics/epoch-1",
        "metrics/epoch-1/acc.tsv",
        "metrics/loss.tsv",
        "model.bin",
        "notes.txt",
    ]
    assert (tree / "metrics" / "epoch-1" / "acc.tsv").read_text() == "0.9\n"
    assert (tree / "model.bin").read_bytes() == b"w" * 2048
    code, _, err = run(capsys, "artifacts", platform["job"], "--download", "metrics/loss.tsv", "-o", "loss")
    assert code == 0, err
    assert (tmp_path / "loss").read_text() == "0\t1.5\n"
    code, _, _ = run(capsys, "artifacts", platform["job"], "--download", "metrics", "-o", "m")
    assert code == 0 and sorted(os.listdir(tmp_path / "m")) == ["epoch-1", "loss.tsv"]


def test_artifacts_errors_are_one_line(platform, capsys, tmp_path, monkeypatch):
    keep(platform["top"])
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    for argv, words in (
        (["artifacts", "nosuchjob"], "no job 'nosuchjob'"),
        (["artifacts", platform["job"], "--download", "nope.bin", "-o", "x"], "no file or folder 'nope.bin'"),
        (["artifacts", platform["job"], "--download", "../x"], "leaves the folder"),
        (["artifacts", platform["job"], "--download", "notes.txt"], "notes.txt exists"),
        (["artifacts", platform["job"], "-o", "x"], "give it with --download"),
    ):
        code, _, err = run(capsys, *argv)
        assert code == 1 and words in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert (tmp_path / "notes.txt").read_text() == "mine" and not (tmp_path / "x").exists()
