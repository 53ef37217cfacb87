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

Clients retry a submission that got no answer with the same Idempotency-Key, so a job is accepted once. At
the end every accepted job must have succeeded, and the figures are:

    lost    accepted, and unknown to the API
    stuck   known, and not finished by the deadline
    failed  finished, but not succeeded
    twice   a replica whose command ran more than once
"""

from __future__ import annotations

import argparse
import json
import os
import random
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
    succeeded: int
    lost: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    twice: list[str] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    seconds: float = 0.0

    def summary(self) -> dict:
        backs = [k.back_after_s for k in self.kills if k.back_after_s is not None]
        return {
            "jobs": self.jobs,
            "gangs": self.gangs,
            "accepted": self.accepted,
            "succeeded": self.succeeded,
            "kills": len(self.kills),
            "back_after_s_max": max(backs, default=None),
            "back_after_s_median": sorted(backs)[len(backs) // 2] if backs else None,
            "lost": len(self.lost),
            "twice": len(self.twice),
            "stuck": len(self.stuck),
            "failed": len(self.failed),
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


class Platform:
    """`gpuyard up --simulate-gpus 8` in `base`, on free ports; its children found through /proc."""

    def __init__(self, base: Path, gpus: int):
        self.base = base
        self.port, self.nats_port, serving, monitor = _free_ports(4)
        self.env = {**os.environ, "GPUYARD_CONFIG_DIR": str(base / "config"), "PYTHONUNBUFFERED": "1"}
        for name in ("GPUYARD_SERVER", "GPUYARD_TOKEN"):
            self.env.pop(name, None)
        self.log = base / "up.log"
        argv = [str(BIN / "gpuyard"), "up", "--data-dir", str(base / "data"), "--simulate-gpus", str(gpus)]
        argv += ["--port", str(self.port), "--nats-port", str(self.nats_port)]
        argv += ["--serving-port", str(serving), "--monitor-port", str(monitor)]
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
        needle = "nats-server" if target == "nats" else f"services.{target}"
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


def _spec(i: int, gang: bool, markers: Path) -> dict:
    seconds = 0.1 + (i % 10) * 0.2  # 0.1 to 1.9 s: many jobs are running at each kill
    mark = f'echo "$GPUYARD_ATTEMPT" >> "$CHAOS_MARKERS/$GPUYARD_JOB_ID.$RANK"; sleep {seconds:.1f}'
    return {
        "name": f"chaos-{i}",
        "command": ["sh", "-c", mark],
        "env": {"CHAOS_MARKERS": str(markers)},
        "resources": {"gpus": 0.5, "cpus": 0.01, "memory": "1MB"}
        if gang
        else {"gpus": 0.125, "cpus": 0.01, "memory": "1MB"},
        "replicas": GANG_REPLICAS if gang else 1,
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
                time.sleep(float(r.headers.get("Retry-After", 0.2)))

    def join(self, timeout: float) -> None:
        for t in self.threads:
            t.join(timeout)


def run_chaos(
    jobs: int = 1000,
    kills: int = 2,
    gang_every: int = 100,
    seed: int = 0,
    gap: float = 3.0,
    deadline: float = 300.0,
    workdir: Path | None = None,
    say: Callable[[str], None] = print,
) -> ChaosResult:
    rng = random.Random(seed)
    base = Path(workdir or tempfile.mkdtemp(prefix="gpuyard-chaos-"))
    markers = Path(tempfile.mkdtemp(prefix="gpuyard-chaos-markers-"))
    markers.chmod(0o1777)  # jobs may run as an unprivileged user: each replica appends to its own file
    schedule = [t for t in TARGETS for _ in range(kills)]
    rng.shuffle(schedule)
    specs = [_spec(i, gang_every > 0 and i % gang_every == gang_every - 1, markers) for i in range(jobs)]
    result = ChaosResult(jobs=jobs, gangs=sum(s["replicas"] > 1 for s in specs), accepted=0, succeeded=0)
    t0 = time.monotonic()
    platform = Platform(base, gpus=8)
    try:
        rate = jobs / max(len(schedule) * (gap + 2.0), 1.0)  # submitting lasts about as long as the kills
        submitters = Submitters(platform, specs, rate, clients=4)
        say(f"chaos: {jobs} jobs at {rate:.0f}/s, kills in this order: {', '.join(schedule)} (logs: {base})")
        for target in schedule:
            time.sleep(rng.uniform(gap / 2, gap))
            pid = _wait(lambda t=target: platform.child(t), 60, f"{target} running")
            os.kill(pid, signal.SIGKILL)
            kill = Kill(target, pid, round(time.monotonic() - t0, 2))
            result.kills.append(kill)
            start = time.monotonic()
            try:
                _wait(lambda t=target, p=pid: platform.back(t, p), 90, f"{target} back")
                kill.back_after_s = round(time.monotonic() - start, 2)
            except TimeoutError:
                pass
            say(f"  killed {target} (pid {pid}) at {kill.at_s:.1f}s; back after {kill.back_after_s}s")
        submitters.join(deadline)
        result.accepted = len(submitters.accepted)
        say(f"chaos: {result.accepted} of {jobs} accepted; waiting for every job to end")
        states = _final_states(
            platform, [job_id for job_id, _ in submitters.accepted.values()], deadline, say
        )
        for job_id, replicas in submitters.accepted.values():
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
    finally:
        platform.stop()
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
    print(json.dumps({**result.summary(), "kills_detail": [asdict(k) for k in result.kills]}, indent=2))
    bad = result.lost or result.twice or result.stuck or result.failed
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
