"""Chaos: jobs through `gpuyard up` while its scheduler, executor, submit service and NATS are killed.

    python benchmarks/chaos.py                          # 5,000 jobs, each target killed 5 times
    python benchmarks/chaos.py --jobs 1000 --kills 2    # the size tests/chaos runs in CI

It starts `gpuyard up --simulate-gpus 8` in a temporary directory and submits short jobs at a steady pace
from several clients, one gang of 16 replicas (half a GPU each: the whole node) in every `--gang-every`. Each
job's command appends a line to a marker file per replica, so every real run of it is counted. Meanwhile the
scheduler, an executor, the submit service and the NATS server are each killed with SIGKILL `--kills` times,
in a random order (`--seed`); `gpuyard up` restarts them. After each kill the benchmark waits until the
service is back: a new process whose heartbeat the API shows (the submit service: answering /healthz; NATS:
accepting connections again), and records how long that took.

`run_chaos` also takes another backend's platform (`env`, `gpus`, `executors`), the jobs' GPUs (`Shape`), the
targets to kill (`schedule`) and how to kill those that are not `gpuyard up`'s children (`Outside`): the Slurm
backend's crash test (tests/integration/slurm/test_slurm_chaos.py) runs it against a real Slurm cluster, with
slurmctld restarted among the kills.

Clients retry a submission that got no answer with the same Idempotency-Key, so a job is accepted once, and
wait the Retry-After of a 429. The platform runs with its limits set low (`LIMITS`), and a hostile tenant
(`Hostile`) reaches each of them again and again during the kills: bodies with no credential, bodies and model
files over the limits, one upload more than it may have in progress, jobs beyond its queue limit, and jobs that
print more than its log budget. Each must get its own answer (401, 413, 429; 503 or no answer while a service
is down), never another, and its accepted jobs count with the others. At the end every accepted job must have
succeeded, and the figures are:

    lost    accepted, and unknown to the API
    stuck   known, and not finished by the deadline
    failed  finished, but not succeeded
    twice   a replica whose command ran more than once
    hostile the hostile tenant's answers by probe and status (and `unexpected`: those not its limit's)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

BIN = Path(sys.executable).parent
TARGETS = ("scheduler", "executor", "submit", "nats")
GANG_REPLICAS = 16
DONE = {"succeeded", "failed", "cancelled"}
HOSTILE = "mallory"
MAX_BODY = 64 << 10
MAX_MODEL = 1 << 20
LOG_BUDGET = 256 << 10
LIMITS = {  # the limits a tenant meets, set low: the hostile tenant reaches each of them during the kills
    "GPUYARD_MAX_BODY_BYTES": str(MAX_BODY),
    "GPUYARD_MAX_MODEL_BYTES": str(MAX_MODEL),
    "GPUYARD_MAX_UPLOADS_PER_TENANT": "1",
    "GPUYARD_MAX_QUEUED_PER_TENANT": "100",  # every tenant's, the chaos clients' too
    "GPUYARD_QUEUE_LIMITS": f"{HOSTILE}=2",
    "GPUYARD_USER_GPU_CAP": f"{HOSTILE}=1",  # its jobs of one GPU run one at a time: the others wait
    "GPUYARD_TENANT_LOG_BUDGET": str(LOG_BUDGET),
}
EXPECTED = {  # probe -> the answer of the limit it reaches
    "no credential": 401,
    "body over max_body_bytes": 413,
    "model over max_model_bytes": 413,
    "upload over max_uploads_per_tenant": 429,
    "job over its queue limit": 429,
}
DOWN = 503  # a service or NATS is down: temporarily unavailable, also an answer to a limit's probe
TRUNCATED = "output truncated"  # the executor's line where a tenant's output passes its log budget


@dataclass
class Kill:
    target: str
    pid: int
    at_s: float
    back_after_s: float | None = None


@dataclass
class ChaosResult:
    jobs: int
    gangs: int
    accepted: int
    succeeded: int  # the chaos clients' jobs and the hostile tenant's
    hostile_jobs: int = 0  # the hostile tenant's jobs accepted
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    seconds: float = 0.0
    hostile: dict[str, dict[int, int]] = field(default_factory=dict)  # probe -> status -> answers
    unexpected: list[str] = field(default_factory=list)  # a probe's answers that were not its limit's
    truncated: bool = False  # a hostile job's output ends with the log budget's line

    def reached_every_limit(self) -> bool:
        """Whether every probe of the hostile tenant had its limit's answer at least once."""
        return all(self.hostile.get(probe, {}).get(status) for probe, status in EXPECTED.items())

    def summary(self) -> dict:
        backs = [k.back_after_s for k in self.kills if k.back_after_s is not None]
        return {
            "jobs": self.jobs,
            "gangs": self.gangs,
            "accepted": self.accepted,
            "hostile_jobs": self.hostile_jobs,
            "succeeded": self.succeeded,
            "kills": len(self.kills),
            "back_after_s_max": max(backs, default=None),
            "back_after_s_median": sorted(backs)[len(backs) // 2] if backs else None,
            "lost": len(self.lost),
            "twice": len(self.twice),
            "stuck": len(self.stuck),
            "failed": len(self.failed),
            "hostile": {probe: dict(sorted(codes.items())) for probe, codes in self.hostile.items()},
            "unexpected": len(self.unexpected),
            "log_budget_reached": self.truncated,
            "seconds": round(self.seconds, 1),
        }


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _wait(check: Callable[[], object], timeout: float, what: str) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"{what} not within {timeout:.0f}s")


@dataclass(frozen=True)
class Outside:
    """A target that is not one of `gpuyard up`'s children (a Slurm controller): `kill()` kills it (and has
    whatever keeps it running start it again) and says the pid killed; `back(pid)` whether it runs again."""

    kill: Callable[[], int]
    back: Callable[[int], bool]


class Platform:
    """`gpuyard up --simulate-gpus N` in `base`, on free ports; its children found through /proc. `env`: more
    settings (another executor backend's); `executors`: its executor processes (None: `gpuyard up`'s default)."""

    def __init__(
        self, base: Path, gpus: int, env: dict[str, str] | None = None, executors: int | None = None
    ):
        self.base = base
        self.port, self.nats_port, serving, monitor = _free_ports(4)
        self.env = {
            **os.environ,
            **LIMITS,
            "GPUYARD_CONFIG_DIR": str(base / "config"),
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        for name in ("GPUYARD_SERVER", "GPUYARD_TOKEN"):
            self.env.pop(name, None)
        self.log = base / "up.log"
        argv = [str(BIN / "gpuyard"), "up", "--data-dir", str(base / "data"), "--simulate-gpus", str(gpus)]
        argv += ["--port", str(self.port), "--nats-port", str(self.nats_port)]
        argv += ["--serving-port", str(serving), "--monitor-port", str(monitor)]
        argv += ["--executors", str(executors)] if executors is not None else []
        self.proc = subprocess.Popen(argv, env=self.env, stdout=self.log.open("ab"), stderr=subprocess.STDOUT)
        self.server = f"http://127.0.0.1:{self.port}"
        self.http: httpx.Client | None = None
        _wait(self._up, 90, "gpuyard up")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"gpuyard up exited with {self.proc.returncode}: see {self.log}")
        try:
            token = json.loads((self.base / "config" / "config.json").read_text())["token"]
        except (OSError, ValueError, KeyError):
            return False
        self.http = httpx.Client(
            base_url=self.server, headers={"Authorization": f"Bearer {token}"}, timeout=10
        )
        try:
            nodes = self.http.get("/v1/nodes").json()
        except (httpx.HTTPError, ValueError):
            return False
        return any(n.get("gpus") for n in nodes)

    def child(self, target: str) -> int | None:
        """The pid of the supervised process for `target` (the first executor), None while it is down."""
        needle = "nats-server" if target == "nats" else f"gpuyard.services.{target}"
        found = []
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                children = (task / "children").read_text().split()
            except OSError:  # a thread that ended meanwhile
                continue
            for pid in children:
                try:
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                worker = argv[argv.index(b"--executor-worker") + 1] if b"--executor-worker" in argv else b"0"
                if any(needle.encode() in arg for arg in argv) and worker == b"0":
                    found.append(int(pid))
        return found[0] if found else None

    def back(self, target: str, old_pid: int) -> bool:
        """Whether `target` runs again in a new process that does its work."""
        pid = self.child(target)
        if pid is None or pid == old_pid:
            return False
        try:
            if target == "submit":
                return self.http.get("/healthz", timeout=2).status_code == 200
            if target == "nats":
                with socket.create_connection(("127.0.0.1", self.nats_port), timeout=1):
                    return True
            services = self.http.get("/v1/services", timeout=2).json()
        except (OSError, httpx.HTTPError, ValueError):
            return False
        return any(s["pid"] == pid for s in services)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


@dataclass(frozen=True)
class Shape:
    """The GPUs of the chaos jobs: a single job's, and a gang's replicas and each one's share (by default the
    whole of `gpuyard up --simulate-gpus 8`)."""

    job_gpus: float = 0.125
    gang_replicas: int = GANG_REPLICAS
    gang_gpus: float = 0.5
    memory: str = "1MB"
    """Each replica's memory (where a backend enforces it, what `sh` and `sleep` need)."""


def _spec(i: int, gang: bool, markers: Path, shape: Shape = Shape()) -> dict:
    seconds = 0.1 + (i % 10) * 0.2  # 0.1 to 1.9 s: many jobs are running at each kill
    mark = f'echo "$GPUYARD_ATTEMPT" >> "$CHAOS_MARKERS/$GPUYARD_JOB_ID.$RANK"; sleep {seconds:.1f}'
    return {
        "name": f"chaos-{i}",
        "command": ["sh", "-c", mark],
        "env": {"CHAOS_MARKERS": str(markers)},
        "resources": {
            "gpus": shape.gang_gpus if gang else shape.job_gpus,
            "cpus": 0.01,
            "memory": shape.memory,
        },
        "replicas": shape.gang_replicas if gang else 1,
    }


class Submitters:
    """`clients` threads submitting the jobs at `rate` per second; a submission without an answer (the
    submit service or NATS is down) is sent again with the same Idempotency-Key until it is accepted."""

    def __init__(self, platform: Platform, specs: list[dict], rate: float, clients: int):
        self.platform, self.specs, self.rate = platform, specs, rate
        self.accepted: dict[int, tuple[str, int]] = {}  # job number → (job id, replicas)
        self.next = 0
        self.lock = threading.Lock()
        self.t0 = time.monotonic()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]
        for t in self.threads:
            t.start()

    def _take(self) -> int | None:
        with self.lock:
            if self.next >= len(self.specs):
                return None
            i, self.next = self.next, self.next + 1
        time.sleep(max(0.0, self.t0 + i / self.rate - time.monotonic()))
        return i

    def _run(self) -> None:
        http = httpx.Client(base_url=self.platform.server, headers=self.platform.http.headers, timeout=10)
        while (i := self._take()) is not None:
            key = str(uuid.uuid4())
            while True:
                try:
                    r = http.post("/v1/jobs", json=self.specs[i], headers={"Idempotency-Key": key})
                except httpx.HTTPError:
                    time.sleep(0.2)
                    continue
                if r.status_code in (200, 202):
                    with self.lock:
                        self.accepted[i] = (r.json()["job_id"], self.specs[i]["replicas"])
                    break
                if r.status_code < 500 and r.status_code != 429:
                    raise RuntimeError(f"submission {i} refused: HTTP {r.status_code} {r.text[:300]}")
                time.sleep(
                    min(float(r.headers.get("Retry-After", 0.2)), 2.0)
                )  # (at most 2 s: the run keeps pace)

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)


class Hostile:
    """A tenant that reaches every limit of `LIMITS`, round after round, until `stop()`: each probe's answers
    are counted by status, and an answer that is neither its limit's nor `DOWN` is kept as unexpected. The jobs
    it gets accepted (one GPU each, printing more than its log budget) must succeed like the others."""

    def __init__(self, platform: Platform, markers: Path):
        self.platform, self.markers = platform, markers
        token = _wait(self._token, 60, "a token of the hostile tenant")
        self.headers = {"Authorization": f"Bearer {token}"}
        self.http = httpx.Client(base_url=platform.server, headers=self.headers, timeout=10)
        self.answers: dict[str, dict[int, int]] = {probe: {} for probe in EXPECTED}
        self.unexpected: list[str] = []
        self.accepted: dict[int, tuple[str, int]] = {}  # its job number -> (job id, replicas)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _token(self) -> str | None:
        try:
            r = self.platform.http.post("/v1/admin/tokens", json={"tenant": HOSTILE, "user": "m"})
        except httpx.HTTPError:
            return None
        return r.json()["token"] if r.status_code in (200, 201) else None

    def stop(self) -> None:
        """Ends the rounds once every probe has had its limit's answer at least once (at most 110 s on)."""
        self._stop.set()
        self.thread.join(120)

    def _reached_every_limit(self) -> bool:
        return all(self.answers[probe].get(status) for probe, status in EXPECTED.items())

    def _run(self) -> None:
        probes = {
            "no credential": self._no_credential,
            "body over max_body_bytes": self._large_body,
            "model over max_model_bytes": self._large_model,
            "upload over max_uploads_per_tenant": self._one_upload_too_many,
            "job over its queue limit": self._jobs_until_refused,
        }
        deadline = None
        while True:
            if self._stop.is_set():
                deadline = deadline or time.monotonic() + 110
                if self._reached_every_limit() or time.monotonic() > deadline:
                    return
            for probe, send in probes.items():
                try:
                    status, text = send()
                except (OSError, httpx.HTTPError):  # a service is down: no answer
                    continue
                self.answers[probe][status] = self.answers[probe].get(status, 0) + 1
                if status not in (EXPECTED[probe], DOWN):
                    self.unexpected.append(f"{probe}: HTTP {status} {text[:200]}")
            time.sleep(0.3)

    def _no_credential(self) -> tuple[int, str]:
        """A body of 2 MiB declared, 4 KiB of it sent, with no token: answered before the rest comes."""
        return _raw_post(self.platform.port, "/v1/jobs", {"Content-Length": str(2 << 20)}, b"{" * 4096)

    def _large_body(self) -> tuple[int, str]:
        spec = {"name": "too-large", "command": "true", "env": {"PAD": "x" * (2 * MAX_BODY)}}
        r = self.http.post("/v1/jobs", json=spec)
        return r.status_code, r.text

    def _large_model(self) -> tuple[int, str]:
        r = self.http.post(
            "/v1/models",
            params={"name": "too-large"},
            content=b"\0" * (2 * MAX_MODEL),
            headers={"Content-Type": "application/octet-stream"},
        )
        return r.status_code, r.text

    def _one_upload_too_many(self) -> tuple[int, str]:
        """A second upload while a first one is in progress: the first's head sent and the rest held back until
        the API stages it (its file appears in the model store's uploads folder), then dropped."""
        uploads = self.platform.base / "data" / "models" / ".uploads"
        before = set(uploads.glob("*.part")) if uploads.exists() else set()
        held = _open_post(
            self.platform.port,
            "/v1/models?name=held",
            {
                **self.headers,
                "Content-Type": "application/octet-stream",
                "Content-Length": str(MAX_MODEL // 2),
            },
            b"\0" * 4096,
        )
        try:
            _wait(lambda: set(uploads.glob("*.part")) - before, 10, "the first upload staged")
            r = self.http.post(
                "/v1/models",
                params={"name": "second"},
                content=b"not onnx",
                headers={"Content-Type": "application/octet-stream"},
            )
            return r.status_code, r.text
        except TimeoutError as exc:  # the submit service went down meanwhile: no answer
            raise ConnectionError(str(exc)) from None
        finally:
            held.close()  # the first upload ends unfinished: its slot and its file are given back

    def _jobs_until_refused(self) -> tuple[int, str]:
        """Jobs of one GPU until one is refused: its user may hold one GPU, so from the second on they wait, and
        its queue holds two."""
        for _ in range(8):
            number = len(self.accepted)
            r = self.http.post(
                "/v1/jobs",
                json=_hostile_spec(number, self.markers),
                headers={"Idempotency-Key": str(uuid.uuid4())},
            )
            if r.status_code not in (200, 202):
                return r.status_code, r.text
            self.accepted[number] = (r.json()["job_id"], 1)
        return r.status_code, "eight jobs accepted, none refused"

    def log_budget_reached(self, deadline: float) -> bool:
        """Whether one of its jobs' output ends with the log budget's line (the output of a job is shipped as it
        comes and after it ends: looked for until `deadline` seconds)."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            for job_id, _ in list(self.accepted.values()):
                try:
                    r = self.http.get(f"/v1/jobs/{job_id}/logs", params={"tail": 3})
                except httpx.HTTPError:
                    continue
                if r.status_code == 200 and TRUNCATED in r.text:
                    return True
            time.sleep(1)
        return False


def _hostile_spec(number: int, markers: Path) -> dict:
    mark = 'echo "$GPUYARD_ATTEMPT" >> "$CHAOS_MARKERS/$GPUYARD_JOB_ID.$RANK"'
    flood = f"head -c {4 * LOG_BUDGET} /dev/zero | tr '\\0' x | fold -w 99"  # four times its log budget
    return {
        "name": f"hostile-{number}",
        "command": ["sh", "-c", f"{mark}; {flood}; sleep 0.2"],
        "env": {"CHAOS_MARKERS": str(markers)},
        "resources": {"gpus": 1, "cpus": 0.01, "memory": "1MB"},
    }


def _open_post(port: int, target: str, headers: dict[str, str], head: bytes) -> socket.socket:
    """A POST whose request line, headers and the first bytes of its body are sent; the rest never is."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    lines = [f"POST {target} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in headers.items())]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + head)
    return sock


def _raw_post(port: int, target: str, headers: dict[str, str], head: bytes) -> tuple[int, str]:
    """The status and the head of the answer to a POST of which only `head` of the body is sent."""
    sock = _open_post(port, target, headers, head)
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed with no answer")
            data += chunk
        return int(data.split(b" ", 2)[1]), data.decode(errors="replace")
    finally:
        sock.close()


def run_chaos(
    jobs: int = 1000,
    kills: int = 2,
    gang_every: int = 100,
    seed: int = 0,
    gap: float = 3.0,
    deadline: float = 300.0,
    workdir: Path | None = None,
    say: Callable[[str], None] = print,
    *,
    schedule: list[str] | None = None,
    outside: dict[str, Outside] | None = None,
    gpus: int = 8,
    env: dict[str, str] | None = None,
    executors: int | None = None,
    shape: Shape = Shape(),
    hostile: bool = True,
) -> ChaosResult:
    """`schedule`: the targets killed, each once per mention, in a random order (default: every one of
    `TARGETS` `kills` times); `outside`: how to kill those that are not `gpuyard up`'s children. `gpus`, `env`,
    `executors`: the platform (another backend's settings, e.g. Slurm's with `gpus=0`); `shape`: the jobs' GPUs;
    `hostile`: whether the hostile tenant reaches the limits meanwhile."""
    rng = random.Random(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="gpuyard-chaos-"))
    markers = Path(tempfile.mkdtemp(prefix="gpuyard-chaos-markers-"))
    markers.chmod(0o1777)  # jobs may run as an unprivileged user: each replica appends to its own file
    schedule = list(schedule) if schedule is not None else [t for t in TARGETS for _ in range(kills)]
    rng.shuffle(schedule)
    outside = outside or {}
    specs = [
        _spec(i, gang_every > 0 and i % gang_every == gang_every - 1, markers, shape) for i in range(jobs)
    ]
    result = ChaosResult(jobs=jobs, gangs=sum(s["replicas"] > 1 for s in specs), accepted=0, succeeded=0)
    t0 = time.monotonic()
    platform = Platform(base, gpus=gpus, env=env, executors=executors)
    try:
        rate = jobs / max(len(schedule) * (gap + 2.0), 1.0)  # submitting lasts about as long as the kills
        submitters = Submitters(platform, specs, rate, clients=4)
        tenant = Hostile(platform, markers) if hostile else None
        say(f"chaos: {jobs} jobs at {rate:.0f}/s, kills in this order: {', '.join(schedule)} (logs: {base})")
        for target in schedule:
            time.sleep(rng.uniform(gap / 2, gap))
            if target in outside:
                pid, back = outside[target].kill(), outside[target].back
            else:
                pid = _wait(lambda t=target: platform.child(t), 60, f"{target} running")
                os.kill(pid, signal.SIGKILL)
                back = functools.partial(platform.back, target)
            kill = Kill(target, pid, round(time.monotonic() - t0, 2))
            result.kills.append(kill)
            start = time.monotonic()
            try:
                _wait(lambda b=back, p=pid: b(p), 90, f"{target} back")
                kill.back_after_s = round(time.monotonic() - start, 2)
            except TimeoutError:
                pass
            say(f"  killed {target} (pid {pid}) at {kill.at_s:.1f}s; back after {kill.back_after_s}s")
        submitters.join(deadline)
        if tenant is not None:
            tenant.stop()
            result.hostile_jobs = len(tenant.accepted)
            result.hostile, result.unexpected = tenant.answers, tenant.unexpected
        result.accepted = len(submitters.accepted)
        say(f"chaos: {result.accepted} of {jobs} accepted, {result.hostile_jobs} of the hostile tenant's")
        every = [*submitters.accepted.values(), *(tenant.accepted.values() if tenant else ())]
        states = _final_states(platform, [job_id for job_id, _ in every], deadline, say)
        for job_id, replicas in every:
            state = states.get(job_id)
            if state is None:
                result.lost.append(job_id)
            elif state not in DONE:
                result.stuck.append(job_id)
            elif state != "succeeded":
                result.failed.append(job_id)
            else:
                result.succeeded += 1
            for rank in range(replicas):
                path = markers / f"{job_id}.{rank}"
                if path.exists() and len(path.read_text().splitlines()) > 1:
                    result.twice.append(f"{job_id}.{rank}")
        result.truncated = tenant.log_budget_reached(60) if tenant is not None else False
    finally:
        platform.stop()
        shutil.rmtree(markers, ignore_errors=True)
        result.seconds = time.monotonic() - t0
    return result


def _final_states(platform: Platform, job_ids: list[str], deadline: float, say) -> dict[str, str]:
    """Each job's state once all are final, or at the deadline; a job the API does not know is absent."""
    states: dict[str, str] = {}
    end = time.monotonic() + deadline
    while True:
        open_ = [j for j in job_ids if states.get(j) not in DONE]
        for job_id in open_:
            try:
                r = platform.http.get(f"/v1/jobs/{job_id}")
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                states[job_id] = r.json()["state"]
            elif r.status_code == 404:
                states.pop(job_id, None)
        waiting = sum(states.get(j) not in DONE for j in job_ids)
        if not waiting or time.monotonic() > end:
            return states
        say(f"  {waiting} jobs still open")
        time.sleep(2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs of each target")
    parser.add_argument("--gang-every", type=int, default=100, help="one gang of 16 replicas in every N jobs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--deadline", type=float, default=600, help="seconds every job has to finish")
    args = parser.parse_args()
    result = run_chaos(args.jobs, args.kills, args.gang_every, args.seed, deadline=args.deadline)
    detail = {"kills_detail": [asdict(k) for k in result.kills], "unexpected_detail": result.unexpected[:20]}
    print(json.dumps({**result.summary(), **detail}, indent=2))
    bad = result.lost or result.twice or result.stuck or result.failed or result.unexpected
    bad = bad or not result.reached_every_limit() or not result.truncated
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
