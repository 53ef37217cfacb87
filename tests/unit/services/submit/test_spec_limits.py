"""A spec the platform could never run, or never read, is refused before it is queued, with the limit in its
answer: a number too long to read (YAML or JSON) is a 422, not a 500; a command and environment larger than a
replica's start can carry (shared/contracts/jobspec.py SPEC_START_BYTES, out of REPLICA_START_BYTES) are a 422 at
submit and validate and one line of the CLI, not a job that fails to start."""

from __future__ import annotations

import json
import os
import socket

import pytest
from fastapi.testclient import TestClient

from gpuyard import cli
from gpuyard.services.executor.jobenv import replica_env
from gpuyard.shared.contracts.events.jobs import JobPlaced, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import (
    REPLICA_START_BYTES,
    SPEC_START_BYTES,
    JobSpec,
    start_bytes,
    start_error,
)
from gpuyard.shared.contracts.specfiles import SpecError, load_spec_text
from tests.unit.services.submit.submitctx import submit_app, submit_context

VISION = {"Authorization": "Bearer tok-vision"}
YAML = {**VISION, "Content-Type": "application/yaml"}
JSON = {**VISION, "Content-Type": "application/json"}
DIGITS = "9" * 4301
ROUTES = ("/v1/jobs", "/v1/jobs/validate")


@pytest.fixture(params=[True, False], ids=["fast-path", "route"])
def api(tmp_path, request):
    with (
        submit_context(tmp_path, max_body_bytes=2 << 20) as ctx,
        TestClient(submit_app(ctx, fast=request.param), raise_server_exceptions=False) as client,
    ):
        yield client


def reason(answer) -> str:
    detail = answer.json()["detail"]
    return detail if isinstance(detail, str) else " ".join(e["msg"] for e in detail)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "body",
    [
        f"command: train\nreplicas: {DIGITS}\n",
        f"command: train\nenv: {{A: [-{DIGITS}]}}\n",
        f"command: train\nreplicas: 0x{'f' * 4000}\n",  # (read without Python's limit, too long to write)
    ],
    ids=["replicas", "nested", "hexadecimal"],
)
def test_a_yaml_spec_with_a_number_too_long_to_read_is_a_422_that_says_where(api, route, body):
    answer = api.post(route, content=body, headers=YAML)
    assert answer.status_code == 422, answer.text
    assert "digits, more than can be read (at most 4,300)" in reason(answer)
    assert answer.json()["detail"][0]["loc"][1:] == [2, 11]  # its line and column


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    "body",
    [
        f'{{"command": "train", "replicas": {DIGITS}}}',
        f'{{"command": "x", "resources": {{"gpus": -{DIGITS}}}}}',
    ],
    ids=["replicas", "gpus"],
)
def test_a_json_spec_with_a_number_too_long_to_read_is_a_422_that_says_so(api, route, body):
    answer = api.post(route, content=body, headers=JSON)
    assert answer.status_code == 422, answer.text
    assert "a number of 4,301 digits, more than can be read (at most 4,300)" in reason(answer)


def test_a_json_body_that_cannot_be_parsed_for_another_reason_is_still_a_400_or_422(api):
    assert api.post("/v1/jobs", content=b'{"command": "\xff"}', headers=JSON).status_code == 400
    assert api.post("/v1/jobs", content=b'{"command": ', headers=JSON).status_code == 422


def test_the_spec_files_reading_says_the_same_for_yaml_and_json():
    with pytest.raises(SpecError, match=r"^job.yaml, line 2, column 11: .*a number of 4,301 digits"):
        load_spec_text(f"command: x\nreplicas: {DIGITS}\n", filename="job.yaml")
    with pytest.raises(SpecError, match=r"^job.json: a number of 4,301 digits, more than can be read"):
        load_spec_text(f'{{"command": "x", "replicas": {DIGITS}}}', filename="job.json")
    assert load_spec_text("replicas: 0x10\nmax_retries: 1_0\n") == {"replicas": 16, "max_retries": 10}


def padded(size: int, **fields) -> JobSpec:
    """A spec whose start takes exactly `size` bytes, its command filled to it."""
    spec = JobSpec(command="x", **fields)
    return JobSpec(command="x" * (1 + size - start_bytes(spec)), **fields)


def test_a_start_of_the_limits_size_passes_and_one_byte_more_does_not():
    assert start_bytes(padded(SPEC_START_BYTES)) == SPEC_START_BYTES
    assert start_error(padded(SPEC_START_BYTES)) is None
    assert start_error(padded(SPEC_START_BYTES + 1)) is not None
    assert start_error(JobSpec(serve={"model": "m", "version": 1})) is None  # (no process of its own)


def test_text_that_is_not_ascii_counts_as_the_executor_sends_it():
    """The executor sends JSON with every character that is not ASCII escaped: 'é' is 6 bytes, '😀' 12."""
    assert start_bytes(JobSpec(command="é")) == start_bytes(JobSpec(command="e")) + 5
    assert start_bytes(JobSpec(command="😀")) == start_bytes(JobSpec(command="e")) + 11


@pytest.mark.parametrize("route", ROUTES)
def test_ten_thousand_variables_are_refused_at_submit_and_validate_naming_the_limit(api, route):
    env = {f"VAR_{i}": "value" for i in range(10_000)}
    answer = api.post(route, json={"command": "train", "env": env}, headers=VISION)
    assert answer.status_code == 422, answer.text
    assert f"at most {SPEC_START_BYTES:,}" in reason(answer) and "10,000 variables" in reason(answer)


@pytest.mark.parametrize("route", ROUTES)
def test_a_command_of_a_megabyte_is_refused_naming_the_limit(api, route):
    answer = api.post(route, json={"command": "x" * 1_000_000}, headers=VISION)
    assert answer.status_code == 422, answer.text
    assert f"at most {SPEC_START_BYTES:,}" in reason(answer) and "command 1,000,0" in reason(answer)


def test_nothing_is_queued_for_a_refused_spec(api):
    api.post("/v1/jobs", json={"command": "x" * 200_000}, headers=VISION)
    assert api.get("/v1/jobs", headers=VISION).json()["total"] == 0


def test_a_spec_at_the_limit_is_queued(api):
    spec = padded(SPEC_START_BYTES, env={"A": "b"}).model_dump(mode="json", exclude_defaults=True)
    assert api.post("/v1/jobs", json=spec, headers=VISION).status_code == 202


def test_the_cli_refuses_it_in_one_line_before_the_network(tmp_path, capsys):
    big = tmp_path / "big.yaml"
    big.write_text(f"command: {'x' * 200_000}\n")
    long_number = tmp_path / "number.json"
    long_number.write_text(f'{{"command": "x", "replicas": {DIGITS}}}')
    for path, why in ((big, f"at most {SPEC_START_BYTES:,}"), (long_number, "a number of 4,301 digits")):
        code = cli.main(["submit", str(path), "--server", "http://127.0.0.1:9", "--token", "t"])
        err = capsys.readouterr().err
        assert code == 1 and why in err and len(err.strip().splitlines()) == 1, err


def test_a_start_of_a_spec_at_the_limit_goes_through_the_executors_socket_to_its_reaper(monkeypatch):
    """What the limit is derived from: the executor's start message (services/executor/reaper_client.py's),
    with the platform's own environment and the replica's files, fits a datagram of REPLICA_START_BYTES, which
    a socket pair with the system's default buffer carries."""
    spec = padded(SPEC_START_BYTES, env={f"V{i}": "v" for i in range(50)})
    placement = ReplicaPlacement(replica=0, node="node-" + "n" * 60)
    monkeypatch.setenv("PATH", os.pathsep.join(["/usr/local/sbin/" + "p" * 40] * 40))  # a long PATH
    env = replica_env(
        job_id="j" * 16,
        job_name="n" * 63,
        tenant="t" * 63,
        spec=spec,
        placed=JobPlaced(job_id="j" * 16, attempt=100, placements=[placement]),
        replica=placement,
        master_addr="m" * 253,
        master_port=29500,
        simulated=False,
    )
    env["GPUYARD_PUBLISH_TOKEN"] = "gyjob1." + "t" * 300
    files = "/var/lib/gpuyard/" + "d" * 200
    request = dict(
        argv=spec.argv,
        cwd=files,
        env=env,
        pid_file=files,
        exit_file=files,
        log_file=files,
        record={"node": placement.node, "cgroup": files, "shell": True, "memory": 2**40},
        user=[65534, 65534],
        cgroup=files,
    )
    data = json.dumps(request).encode("utf-8", "surrogateescape")
    assert len(data) <= REPLICA_START_BYTES, f"{len(data) - REPLICA_START_BYTES} bytes over"
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    read_fd, write_fd = os.pipe()
    try:
        socket.send_fds(ours, [b"x" * REPLICA_START_BYTES], [write_fd, read_fd])
        received, fds, _, _ = socket.recv_fds(theirs, 4 << 20, 2)
        for fd in fds:
            os.close(fd)
        assert len(received) == REPLICA_START_BYTES
    finally:
        for closing in (ours, theirs):
            closing.close()
        for fd in (read_fd, write_fd):
            os.close(fd)
