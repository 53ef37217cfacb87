"""The CLI's scheduling views (`why`, `ps`, `describe`) against job views made by the real state machine,
mapped to the public model and served by a fake API; `gpuyard sim` handing its arguments to the simulator."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from gpuyard import cli
from gpuyard.cli import build_parser
from gpuyard.client import Client
from gpuyard.shared.contracts.api.jobs import JobOut, job_out
from gpuyard.shared.contracts.events.envelope import make_event
from gpuyard.shared.contracts.events.jobs import (
    GpuShare,
    JobPending,
    JobPlaced,
    JobPreempted,
    JobRequeued,
    JobStarted,
    JobSubmitted,
    PendingReason,
    ReplicaPlacement,
    RequeueReason,
)
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import fold
from gpuyard.shared.contracts.reasons import PendingCode
from gpuyard.shared.contracts.stops import PreemptionCause, preemption_text
from gpuyard.shared.contracts.version import VERSION
from gpuyard.shared.reporting import why
from gpuyard.supervisor.banner import job_rights
from gpuyard.supervisor.ports import free_ports


def view(job_id: str, spec: dict, *steps, tenant: str = "vision", user: str = "ana", at=None) -> dict:
    """A job as GET /v1/jobs/{id} serves it: the public form of the state machine's fold of real events, as
    JSON."""
    at = at or datetime.now(UTC) - timedelta(minutes=5)
    submitted = JobSubmitted(
        job_id=job_id, name=spec.get("name", job_id), tenant=tenant, user=user, spec=JobSpec(**spec)
    )
    events = [make_event(submitted, source="/test", time=at)]
    for i, data in enumerate(steps, start=1):
        events.append(make_event(data, source="/test", time=at + timedelta(seconds=i)))
    return job_out(fold(events)).model_dump(mode="json")


def pending(job_id: str, code: str, message: str, position: int | None, details=None, start=None, attempt=1):
    reason = PendingReason(
        code=code, message=message, details=details or {}, position=position, estimated_start=start
    )
    return JobPending(job_id=job_id, attempt=attempt, reason=reason)


def placed(job_id: str, gpus: list[GpuShare], attempt: int = 1) -> JobPlaced:
    placement = ReplicaPlacement(replica=0, node="n1", gpus=gpus, cpus=8, memory_bytes=32 * 2**30)
    return JobPlaced(job_id=job_id, attempt=attempt, placements=[placement])


BIG = {"name": "big", "command": "python train.py", "priority": "high", "timeout": "2h"}
BIG["resources"] = {"gpus": 4, "cpus": 8, "memory": "16GB"}
SMALL = {"name": "small", "command": "true", "resources": {"gpus": 0.5, "gpu_memory": "8GiB"}}


def head_view() -> dict:
    """Waiting 5 min, first in line, estimated to start in 40 min (from now, when the test runs)."""
    return view(
        "head1",
        BIG,
        pending(
            "head1",
            "insufficient_gpus",
            "needs 4 GPUs on one node; the largest free block is 1 (n1); 1st in line [sic]",
            1,
            {"needed_per_replica": 4, "largest_free": 1.0, "node": "n1"},
            datetime.now(UTC) + timedelta(minutes=40, seconds=20),
        ),
    )


def third_view() -> dict:
    return view(
        "third1",
        SMALL,
        pending("third1", "backfill_would_delay", "fits now but would delay job head1; 3rd in line", 3),
    )


def running_view() -> dict:
    return view(
        "run1",
        SMALL | {"name": "shared"},
        placed("run1", [GpuShare(index=2, fraction=0.5, memory_bytes=8 * 2**30)]),
        JobStarted(job_id="run1", attempt=1, node="n1", replicas=[0]),
    )


@pytest.fixture
def api(monkeypatch):
    """The CLI talks to a fake API that serves these views (through the real Client and its errors); a job's
    logs are served from `api["logs"][job_id]`, and every request is kept in `api["requests"]`."""
    jobs: dict = {"logs": {}, "requests": []}

    def handler(request: httpx.Request) -> httpx.Response:
        jobs["requests"].append(request)
        path = request.url.path
        if path == "/v1/jobs":
            items = [j for k, j in jobs.items() if k not in ("logs", "requests")]
            return httpx.Response(200, json={"items": items, "next_cursor": None})
        job_id = path.removeprefix("/v1/jobs/")
        if job_id.endswith("/logs") and job_id.removesuffix("/logs") in jobs["logs"]:
            return httpx.Response(200, text=jobs["logs"][job_id.removesuffix("/logs")])
        if job_id in jobs:
            return httpx.Response(200, json=jobs[job_id])
        return httpx.Response(404, json={"detail": f"no job {job_id!r}"})

    class FakeClient(Client):
        def __init__(self, server=None, token=None, timeout=30):
            super().__init__("http://api.test", "token")
            self.http = httpx.Client(base_url=self.server, transport=httpx.MockTransport(handler))

    monkeypatch.setattr(cli.common, "Client", FakeClient)
    return jobs


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def rows(text: str) -> dict[str, str]:
    """`why` prints a headline, then 'Label   value' rows; labels are the known ones."""
    labels = sorted(
        {
            "Job",
            "State",
            "Tenant / user",
            "Priority",
            "Asks",
            "Waiting for",
            "Reason",
            "Meaning",
            "Message",
            "Failure",
            "Numbers",
            "Queue position",
            "Estimated start",
            "Replica 0",
            "Preempted",
            "Exit code",
            "Attempt 1",
            "Retry backoff",
        },
        key=len,
        reverse=True,
    )
    out = {}
    for line in text.splitlines()[1:]:
        label = next((label for label in labels if line.startswith(label + " ")), None)
        if label:
            out[label] = line[len(label) :].strip()
    return out


# ---------------------------------------------------------------- why


def test_why_explains_a_waiting_job_with_its_numbers_position_and_estimate(api, capsys):
    api["head1"] = head = head_view()
    code, out, err = run(capsys, "why", "head1")
    assert code == 0 and err == ""
    headline = out.splitlines()[0]
    reason = f"insufficient_gpus: {head['pending']['message']}"
    assert headline == f"waiting: {reason}"
    got = rows(out)
    assert got["Job"] == "head1 (big)"
    assert got["State"] == "queued · attempt 1"
    assert got["Tenant / user"] == "vision / ana"
    assert got["Priority"] == "high"
    assert got["Asks"] == "4 GPUs · 8 CPUs · 16 GB memory · time limit 2h"
    assert got["Waiting for"].startswith("5m")
    assert got["Reason"] == reason  # '[sic]' is text, not console markup
    assert got["Meaning"] == PendingCode.INSUFFICIENT_GPUS.meaning
    assert got["Numbers"] == "needed_per_replica=4 · largest_free=1 · node=n1"
    assert got["Queue position"] == "#1 (1st in line)"
    estimate = datetime.fromisoformat(head["pending"]["estimated_start"]).isoformat()
    assert got["Estimated start"] == f"in about 40 min ({estimate})"


def test_why_says_unknown_when_no_estimate_and_gives_the_place_in_line(api, capsys):
    api["third1"] = third_view()
    got = rows(run(capsys, "why", "third1")[1])
    assert got["Queue position"] == "#3 (3rd in line)"
    assert got["Estimated start"] == "unknown"
    assert got["Asks"] == "0.5 of a GPU · 8 GiB GPU memory · 1 CPU · 2 GB memory"
    assert "Numbers" not in got


def test_why_json_is_the_same_explanation_for_machines(api, capsys):
    api["head1"] = head_view()
    code, out, _ = run(capsys, "why", "head1", "--json")
    data = json.loads(out)
    assert code == 0
    assert data["summary"].startswith("waiting: insufficient_gpus: needs 4 GPUs")
    assert data["pending"]["meaning"] == PendingCode.INSUFFICIENT_GPUS.meaning
    assert data["pending"]["code"] == "insufficient_gpus" and data["pending"]["position"] == 1
    assert data["pending"]["details"] == {"needed_per_replica": 4, "largest_free": 1.0, "node": "n1"}
    assert 40 * 60 - 5 < data["pending"]["estimated_start_in_seconds"] <= 40 * 60 + 20
    assert data["pending"]["estimated_start_text"] == "in about 40 min"
    assert (data["tenant"], data["user"], data["priority"]) == ("vision", "ana", "high")
    assert data["resources"]["total_gpus"] == 4 and data["resources"]["timeout"] == 7200
    assert data["placements"] == [] and data["preemption"] is None


def test_why_shows_where_a_running_job_runs_with_its_gpu_share(api, capsys):
    api["run1"] = running = running_view()
    code, out, _ = run(capsys, "why", "run1")
    assert code == 0
    assert out.splitlines()[0].startswith("running on n1 for ")
    started = datetime.fromisoformat(running["started_at"])
    assert (
        why.summary(JobOut.model_validate(running), started + timedelta(minutes=3)) == "running on n1 for 3m"
    )
    got = rows(out)
    assert got["Replica 0"] == "n1 GPU 2 (×0.5, 8 GiB) · 8 CPUs · 32 GiB"
    assert "Reason" not in got and "Queue position" not in got
    data = json.loads(run(capsys, "why", "run1", "--json")[1])
    assert data["pending"] is None and data["placements"][0]["gpus"][0]["fraction"] == 0.5


def test_why_tells_of_a_preemption_under_way_and_of_the_attempt_it_cost(api, capsys):
    spec = {"name": "low", "command": "true", "priority": "low", "resources": {"gpus": 2}}
    steps = [
        placed("low1", [GpuShare(index=0), GpuShare(index=1)]),
        JobStarted(job_id="low1", attempt=1, node="n1", replicas=[0]),
        JobPreempted(
            job_id="low1", attempt=1, cause=PreemptionCause.PRIORITY, by_job="urgent1", grace_seconds=30
        ),
    ]
    api["low1"] = view("low1", spec, *steps)
    code, out, _ = run(capsys, "why", "low1")
    said = preemption_text(PreemptionCause.PRIORITY)
    assert out.splitlines()[0] == (
        f"running on n1, being preempted ({said}) by job urgent1; it is stopped within 30 s and queued "
        "again as attempt 2"
    )
    assert rows(out)["Preempted"] == f"{said} by job urgent1 · grace 30 s"

    requeued = JobRequeued(job_id="low1", attempt=2, reason=RequeueReason.PREEMPTED, message=said)
    waiting = pending("low1", "insufficient_gpus", "needs 2 GPUs on one node; 1st in line", 1, attempt=2)
    api["low1"] = view("low1", spec, *steps, requeued, waiting)
    got = rows(run(capsys, "why", "low1")[1])
    assert got["State"] == "queued · attempt 2"
    assert got["Attempt 1"] == f"preempted: priority ({said})"
    assert got["Reason"] == "insufficient_gpus: needs 2 GPUs on one node; 1st in line"


def test_why_before_the_first_decision_after_a_retry_and_when_finished(api, capsys):
    api["new1"] = view("new1", {"command": "true"})
    assert "waiting its turn for busy resources" in run(capsys, "why", "new1")[1].splitlines()[0]

    retry = JobRequeued(
        job_id="new1",
        attempt=2,
        reason=RequeueReason.RETRY,
        message="retry 1/2",
        not_before=datetime.now(UTC) + timedelta(minutes=2, seconds=5),
    )
    spec = {"command": "false", "max_retries": 2}
    api["new1"] = view("new1", spec, placed("new1", []), retry)
    assert rows(run(capsys, "why", "new1")[1])["Retry backoff"] == "not before about 2 min"

    from gpuyard.shared.contracts.events.jobs import FailureReason, JobFailed

    failed = JobFailed(
        job_id="new1", attempt=1, reason=FailureReason.EXIT_CODE, exit_code=3, message="exited with 3"
    )
    api["new1"] = view("new1", {"command": "false"}, placed("new1", []), failed)
    out = run(capsys, "why", "new1")[1]
    assert out.splitlines()[0] == "not waiting: it has failed with exit code 3 (exited with 3)"
    assert rows(out)["Failure"] == "exit_code: exited with 3 · exit code 3"


def test_why_of_an_unknown_job_is_one_line_and_exit_1(api, capsys):
    code, out, err = run(capsys, "why", "nope")
    assert code == 1 and out == ""
    assert err.strip() == "error: no job 'nope' (HTTP 404)"


@pytest.mark.parametrize(
    ("delta", "text"),
    [
        (timedelta(seconds=40), "in about 40 s"),
        (timedelta(minutes=40, seconds=10), "in about 40 min"),
        (timedelta(hours=2, minutes=30), "in about 2.5 h"),
        (timedelta(days=3), "in about 3.0 days"),
        (timedelta(0), "now"),
        (timedelta(minutes=-2), "now (the estimate passed 2 min ago)"),
    ],
)
def test_relative_start(delta, text):
    now = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    assert why.relative_start(now + delta, now) == text


def test_relative_start_without_an_estimate_is_unknown():
    assert why.relative_start(None, datetime.now(UTC)) == "unknown"


# ---------------------------------------------------------------- ps and describe


def test_ps_shows_each_waiting_jobs_place_in_line_and_reason(api, capsys):
    api.update({"head1": head_view(), "third1": third_view(), "run1": running_view()})
    code, out, _ = run(capsys, "ps")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["ID", "NAME", "TENANT", "STATE", "POS", "GPUS", "AGE", "REASON"]
    by_id = {line.split()[0]: line for line in lines[1:]}
    assert by_id["head1"].split()[3:5] == ["queued", "#1"]
    assert "insufficient_gpus: needs 4 GPUs on one node" in by_id["head1"]
    assert by_id["third1"].split()[3:5] == ["queued", "#3"]
    assert by_id["run1"].split()[3:5] == ["running", "0.5"]  # no position: the POS cell is empty


def test_ps_and_describe_say_why_a_job_is_preempted_and_how_its_attempt_ended(api, capsys):
    spec = {"name": "drained", "command": "true", "resources": {"gpus": 1}}
    steps = [
        placed("drn1", [GpuShare(index=0)]),
        JobStarted(job_id="drn1", attempt=1, node="n1", replicas=[0]),
        JobPreempted(job_id="drn1", attempt=1, cause=PreemptionCause.DRAIN, node="n1", grace_seconds=30),
    ]
    api["drn1"] = view("drn1", spec, *steps)
    assert "being preempted (drain)" in run(capsys, "ps")[1]
    said = preemption_text(PreemptionCause.DRAIN, "n1")
    preempted = next(line for line in run(capsys, "describe", "drn1")[1].splitlines() if "Preempted" in line)
    assert preempted.split(None, 1)[1].strip() == f"{said}, stopping"

    requeued = JobRequeued(job_id="drn1", attempt=2, reason=RequeueReason.PREEMPTED, message=said)
    api["drn1"] = view("drn1", spec, *steps, requeued)
    out = run(capsys, "describe", "drn1")[1]
    first = next(line for line in out.splitlines() if line.startswith("Attempt 1"))
    assert first.split(None, 2)[2].strip() == "preempted: drain · nodes n1"
    data = json.loads(run(capsys, "describe", "drn1", "--json")[1])["attempts"][0]
    assert (data["outcome"], data["requeue"], data["preemption"], data["node"]) == (
        "preempted",
        "preempted",
        "drain",
        "n1",
    )


def test_describe_and_why_say_the_work_a_preemption_loses(api, capsys):
    spec = {"name": "low", "command": "true", "priority": "low", "resources": {"gpus": 1}}
    steps = [
        placed("lw1", [GpuShare(index=0)]),
        JobStarted(job_id="lw1", attempt=1, node="n1", replicas=[0]),
        JobPreempted(
            job_id="lw1",
            attempt=1,
            cause=PreemptionCause.PRIORITY,
            by_job="urgent1",
            grace_seconds=30,
            lost_work_seconds=725,
        ),
    ]
    api["lw1"] = view("lw1", spec, *steps)
    said = preemption_text(PreemptionCause.PRIORITY)
    preempted = next(line for line in run(capsys, "describe", "lw1")[1].splitlines() if "Preempted" in line)
    assert (
        preempted.split(None, 1)[1].strip() == f"{said} by job urgent1, stopping; lost about 12 min of work"
    )
    got = rows(run(capsys, "why", "lw1")[1])["Preempted"]
    assert got == f"{said} by job urgent1 · grace 30 s · lost about 12 min of work"


def test_describe_shows_the_reason_code_position_numbers_and_estimate(api, capsys):
    api["head1"] = head = head_view()
    out = run(capsys, "describe", "head1")[1]
    waiting = next(line for line in out.splitlines() if line.startswith("Waiting"))
    assert waiting.split(None, 1)[1] == f"insufficient_gpus: {head['pending']['message']}"
    assert "needed_per_replica=4 · largest_free=1 · node=n1" in out
    estimate = next(line for line in out.splitlines() if line.startswith("Estimated start"))
    assert estimate.split(None, 2)[2].strip() == "in about 40 min"


def test_describe_of_a_failed_job_shows_the_failure_and_the_last_lines_of_the_replica_that_failed(
    api, capsys
):
    from gpuyard.shared.contracts.events.jobs import FailureReason, JobFailed, JobReplicaExited

    exited = JobReplicaExited(
        job_id="bad1", attempt=1, node="n1", replica=1, exit_code=3, reason=FailureReason.EXIT_CODE
    )
    failed = JobFailed(
        job_id="bad1", attempt=1, reason=FailureReason.EXIT_CODE, exit_code=3, message="exited with 3"
    )
    api["bad1"] = view("bad1", {"command": "false", "replicas": 2}, placed("bad1", []), exited, failed)
    api["logs"]["bad1"] = "step 9\nabout to fail [sic]\n"
    code, out, _ = run(capsys, "describe", "bad1")
    assert code == 0
    failure = next(line for line in out.splitlines() if line.startswith("Failure"))
    assert failure.split(None, 1)[1].rstrip() == "exit_code: exited with 3 · exit code 3 · replica 1"
    assert out.splitlines()[-3:] == ["Last log lines of replica 1:", "  step 9", "  about to fail [sic]"]
    logs = api["requests"][-1].url
    assert logs.path == "/v1/jobs/bad1/logs"
    assert dict(logs.params) == {"replica": "1", "attempt": "1", "tail": "10"}


def test_ps_asks_for_the_live_states_unless_all_or_a_state_is_given(api, capsys):
    run(capsys, "ps")
    assert api["requests"][-1].url.params.get_list("state") == ["queued", "placed", "running"]
    run(capsys, "ps", "--all")
    assert "state" not in api["requests"][-1].url.params
    run(capsys, "ps", "--state", "failed", "--state", "cancelled")
    assert api["requests"][-1].url.params.get_list("state") == ["failed", "cancelled"]


def test_an_answer_the_cli_cannot_read_is_one_line_not_a_traceback(api, capsys):
    api["odd1"] = {"job_id": "odd1", "state": "hibernating"}
    code, out, err = run(capsys, "describe", "odd1")
    assert code == 1 and out == "" and "Traceback" not in err
    assert err.startswith("error: unexpected answer from http://api.test/v1/jobs/odd1")
    assert len(err.strip().splitlines()) == 1


# ---------------------------------------------------------------- sim: the simulator, run as its own program

NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn0,64000,262144,8,G2\nn1,32000,131072,2,T4\n"
PODS_CSV = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
    "scheduled_time\np0,4000,8192,1,1000,,LS,Running,0,1000,0\np1,2000,4096,1,500,,LS,Running,10,400,20\n"
    "p2,8000,16384,2,1000,,BE,Running,20,3000,25\n"
)


@pytest.fixture
def trace(tmp_path):
    (tmp_path / "nodes.csv").write_text(NODES_CSV)
    (tmp_path / "pods.csv").write_text(PODS_CSV)
    (tmp_path / "columns.csv").write_text("foo,bar\n1,2\n")
    return tmp_path


def one_line_error(code: int, err: str) -> str:
    assert code != 0
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    return err.strip()


def test_gpuyard_sim_hands_its_arguments_unchanged_to_the_simulator(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append((path, argv)))
    args = [
        "--trace",
        "openb_pod_list_gpushare40.csv",
        "--policy",
        "bestfit,fgd,gpuyard",
        "--plot",
        "g40.png",
    ]
    cli.main(["sim", *args])
    assert calls == [(sys.executable, [sys.executable, "-P", "-m", "gpuyard.shared.scheduling.sim", *args])]
    cli.main(["sim", "--help"])
    assert calls[-1][1][4:] == ["--help"]


def test_gpuyard_sim_on_a_client_installation_is_one_line_naming_the_extra_and_exit_2(monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "numpy" else real(name, *a)
    )
    monkeypatch.setattr(os, "execv", lambda *a: pytest.fail("exec without the scheduling core's packages"))
    code, out, err = run(capsys, "sim", "--trace", "x.csv")
    assert code == 2 and out == ""
    line = one_line_error(code, err)
    assert "gpuyard sim runs the platform's scheduler" in line and "no module named 'numpy'" in line
    assert line.rstrip().endswith("[platform]'"), line  # (the extra's brackets reach the terminal)


def test_gpuyard_sim_answers_exactly_as_the_simulator(trace):
    """Through real processes: the same output and exit status, and the simulator's help."""

    def both(*args: str) -> list[tuple[int, str, str]]:
        answers = []
        for program in (["-m", "gpuyard.cli", "sim"], ["-m", "gpuyard.shared.scheduling.sim"]):
            done = subprocess.run(
                [sys.executable, *program, *args], capture_output=True, text=True, timeout=120
            )
            answers.append((done.returncode, done.stdout, done.stderr))
        return answers

    tiny = ["--nodes", str(trace / "nodes.csv"), "--trace", str(trace / "pods.csv"), "--seeds", "1"]
    ran, direct = both(*tiny, "--policy", "bestfit", "--json")
    results = [json.loads(answer[1]) for answer in (ran, direct)]
    for result in results:
        for policy in result["policies"].values():
            policy.pop("seconds")  # how long it took: the one thing that differs from run to run
    assert ran[0] == direct[0] == 0 and results[0] == results[1] and results[0]["mode"] == "inflation"
    refused, direct = both(*tiny, "--ratio", "-1")
    assert refused == direct and refused[0] == 2 and "--ratio must be positive" in refused[2]
    helped, direct = both("--help")
    assert helped == direct and helped[0] == 0 and helped[1].startswith("usage: gpuyard sim")


def test_other_commands_do_not_load_the_simulator_nor_any_service():
    code = (
        "import sys; from gpuyard.cli import build_parser; build_parser().parse_args(['ps', '--all']); "
        "print(any(m.split('.')[0] == 'services' for m in sys.modules), 'numpy' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["False", "False"]


def test_up_refuses_one_port_for_both_the_api_and_nats(capsys, tmp_path):
    code, _, err = run(capsys, "up", "--data-dir", str(tmp_path), "--port", "18999", "--nats-port", "18999")
    assert "--port and --nats-port are both 18999" in one_line_error(code, err)


def test_up_refuses_a_port_in_use_and_names_the_flag(capsys, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run(
            capsys, "up", "--data-dir", str(tmp_path), "--host", "127.0.0.1", "--port", str(port)
        )
    assert f"port {port} for the API is in use" in one_line_error(code, err) and "--port" in err


@pytest.fixture
def up_dirs(tmp_path, monkeypatch):
    """`gpuyard up`'s data dir and the CLI's config dir, in the test's folder; no GPUYARD_* of the shell."""
    for name in [n for n in os.environ if n.startswith("GPUYARD_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("GPUYARD_CONFIG_DIR", str(tmp_path / "config"))
    return tmp_path / "data", tmp_path / "config"


def up_on_free_ports(capsys, data_dir, **ports: int) -> tuple[int, str]:
    """`gpuyard up` with every port it names free, but those given (`serving_port=…`)."""
    flags = ("port", "nats_port", "serving_port", "monitor_port")
    chosen = dict(zip(flags, free_ports("127.0.0.1", len(flags)), strict=True)) | ports
    argv = ["up", "--data-dir", str(data_dir), "--executors", "1"]
    for name, port in chosen.items():
        argv += [f"--{name.replace('_', '-')}", str(port)]
    code, _, err = run(capsys, *argv)
    return code, err


def nothing_started(data_dir, config_dir) -> bool:
    """No log folder, no token minted, no context saved: the supervisor started no process."""
    made = [
        p for p in (data_dir / "logs", data_dir / "tokens.json", config_dir / "config.json") if p.exists()
    ]
    return not made


@pytest.mark.parametrize(
    ("flag", "what"),
    [("serving_port", "the serving API"), ("monitor_port", "the monitor's /metrics"), ("nats_port", "NATS")],
)
def test_up_refuses_any_port_it_would_bind_that_is_in_use_before_starting_anything(
    capsys, up_dirs, flag, what
):
    data_dir, config_dir = up_dirs
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, err = up_on_free_ports(capsys, data_dir, **{flag: port})
    option = "--" + flag.replace("_", "-")
    assert one_line_error(code, err) == (
        f"error: port {port} for {what} is in use on 127.0.0.1: stop what uses it or pass {option}"
    )
    assert nothing_started(data_dir, config_dir)


def test_up_refuses_one_health_port_for_every_process(capsys, up_dirs, monkeypatch):
    data_dir, config_dir = up_dirs
    port = free_ports("127.0.0.1", 1)[0]
    monkeypatch.setenv("GPUYARD_HEALTH_PORT", str(port))  # (as a container image may set it)
    code, err = up_on_free_ports(capsys, data_dir)
    assert one_line_error(code, err) == (
        f"error: GPUYARD_HEALTH_PORT is {port} for both the health endpoints of submit and the health "
        "endpoints of scheduler: unset GPUYARD_HEALTH_PORT: `gpuyard up` gives each process a port of its own"
    )
    assert nothing_started(data_dir, config_dir)


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--nats-port", "99999"], "error: --nats-port 99999 is not a port: 1 to 65535"),
        (["--nats-port", "0"], "error: --nats-port 0 is not a port: 1 to 65535"),
        (["--serving-port", "99999"], "serving_port: Input should be less than or equal to 65535"),
        (["--port", "-1"], "submit_port: Input should be greater than or equal to 1"),
        (["--service-metrics-port", "65535"], "--service-metrics-port 65535 is not a port for 2 processes"),
    ],
)
def test_up_refuses_a_port_number_that_is_not_one_in_one_line(capsys, up_dirs, flags, expected):
    data_dir, config_dir = up_dirs
    try:
        code, _, err = run(capsys, "up", "--data-dir", str(data_dir), "--executors", "1", *flags)
    except SystemExit as refused:  # a setting's refusal: its line is written, exit status 2
        code, err = refused.code, capsys.readouterr().err
    assert expected in one_line_error(code, err)
    assert not data_dir.exists() and nothing_started(data_dir, config_dir)


@pytest.mark.parametrize(
    ("root", "job_users", "says"),
    [
        (False, "", "jobs share this platform's rights[/]: they run as its own user"),
        (False, "*=platform", "run it as root to run jobs as unprivileged users"),
        (
            True,
            "*=platform",
            "jobs run as root[/], this platform's own user: GPUYARD_JOB_USERS='*=platform' (as",
        ),
        (True, "*=platform,vision=1500", "jobs of every tenant but vision run as root[/]"),
        (True, " vision = platform ,*=nobody", "jobs of vision run as root[/]"),
        (True, "", "jobs        run as unprivileged users, one per tenant"),
    ],
)
def test_the_banner_says_whose_rights_jobs_run_with_for_the_user_who_runs_it(root, job_users, says):
    said = "\n".join(job_rights(root, job_users))
    assert says in said
    assert ("run it as root" in said) is (not root)  # never told to a root platform


# ---------------------------------------------------------------- small things a user notices


def test_logs_of_a_job_that_has_not_started_says_why_there_is_no_output(api, capsys):
    api["head1"] = head_view()
    api["logs"]["head1"] = ""
    code, out, err = run(capsys, "logs", "head1")
    assert code == 0 and out == ""
    assert err.strip() == (
        "no output: job head1 has not started yet (queued: insufficient_gpus: needs 4 GPUs on one node; the "
        "largest free block is 1 (n1); 1st in line [sic])"
    )
    api["run1"] = running_view()
    api["logs"]["run1"] = ""
    assert (
        run(capsys, "logs", "run1")[2].strip() == "no output: replica 0 of job run1 has written nothing yet"
    )


def test_describe_writes_sizes_and_counts_as_people_write_them(api, capsys):
    api["head1"] = head_view()
    resources = next(line for line in run(capsys, "describe", "head1")[1].splitlines() if "Resources" in line)
    assert resources.split(None, 1)[1].rstrip() == "4 GPUs · 8 CPUs · 16 GB memory · time limit 2h"


def test_version_and_up_takes_no_client_options(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"gpuyard {VERSION}"
    with pytest.raises(SystemExit) as refused:
        cli.main(["up", "--token", "x"])
    assert refused.value.code == 2 and "unrecognized arguments: --token x" in capsys.readouterr().err
    for command in ("ps", "logs"):
        helps = build_parser()._subparsers._group_actions[0].choices[command]._actions
        assert all(a.help for a in helps), [a.dest for a in helps if not a.help]


def test_describe_says_what_a_dev_environment_runs(api, capsys):
    api["nb1"] = view("nb1", {"name": "nb", "dev": {"root": "work"}, "resources": {"gpus": 0.5}})
    runs = next(line for line in run(capsys, "describe", "nb1")[1].splitlines() if line.startswith("Runs"))
    assert runs.split(None, 1)[1].rstrip() == "a dev environment (JupyterLab), notebooks in work/"
