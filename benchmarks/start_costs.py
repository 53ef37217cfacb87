"""What the pieces of a replica's start cost the executor's process, in microseconds, measured in isolation.

    python benchmarks/start_costs.py [--starts 300] [--dir DIR]

- starting a no-op child (`true`) with glibc's `posix_spawn` (`os.posix_spawnp`, what the executor used
  before replicas were started by its reaper) against `subprocess.Popen`, against a fork whose
  child takes the reaper's steps before its exec (a new session, a child subreaper, its output, its folder,
  its other descriptors closed), and against the reaper's start through the start helper (`replica_start.c`,
  a library built here with the machine's C compiler), whose vfork child takes those steps in C and execs
  `true`: the parent's CPU per start, the child's until it is reaped (its copy-on-write faults, its exec and
  `true` itself),
  and the wall time of the call (mean and p90: with vfork the caller waits until the child has reached exec,
  which on busy cores includes waiting for a CPU);
- `os.mkdir` of a fresh directory under `--dir` (default: the system's temporary folder; give the data disk):
  wall and CPU per call;
- making a replica's path as a `pathlib.Path` against as a string (`gpuyard.shared.runtime.paths` uses strings);
- `gpuyard.shared.contracts.events.envelope.derived_id` against `uuid.uuid5` (the same ids).

The starts are measured in a process like a reaper (`python -I -S`, the standard library only): a fork's cost
grows with the memory of the process that forks. Each figure is the best of 5 rounds (the machine's other work
only adds). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from gpuyard.services.executor.reaper.helper import load_helper, spawn  # (standard library only, as it)
from gpuyard.services.executor.reaper.kernel import subreaper

ROUNDS = 5


def best(measure) -> dict:
    runs = [measure() for _ in range(ROUNDS)]
    return {key: min(r[key] for r in runs) for key in runs[0]}


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fork_as_the_reaper(env: dict, out: int, folder: Path) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child: it execs or exits)
        try:
            os.setsid()
            subreaper()
            os.dup2(out, 1)
            os.dup2(out, 2)
            os.chdir(folder)
            os.closerange(3, 1 << 20)
            os.execvpe("true", ["true"], env)
        finally:
            os._exit(127)
    return pid


def starts(n: int, how: str, folder: Path, helper=None) -> dict:
    env = {"PATH": os.environ.get("PATH", os.defpath)}
    walls, cpu, child_cpu = [], 0.0, 0.0
    with open(os.devnull, "wb") as sink, open(os.devnull, "rb") as nothing:
        for _ in range(n):
            w, c = time.perf_counter(), time.process_time()
            error_r = -1
            if how == "helper":  # (as the reaper: the helper's error pipe says when its exec happened)
                error_r, error_w = os.pipe()
                request = {"argv": ["true"], "env": env, "cwd": str(folder)}
                pid = spawn(helper, request, nothing.fileno(), sink.fileno(), error_w)
                os.close(error_w)
            elif how == "posix_spawn":
                os.chdir(folder)
                out = [(os.POSIX_SPAWN_DUP2, sink.fileno(), 1), (os.POSIX_SPAWN_DUP2, sink.fileno(), 2)]
                pid = os.posix_spawnp("true", ["true"], env, file_actions=out, setsid=True)
            elif how == "fork":
                pid = fork_as_the_reaper(env, sink.fileno(), folder)
            else:
                child = subprocess.Popen(["true"], cwd=folder, env=env, stdout=sink, stderr=sink)
                pid = child.pid
            cpu += time.process_time() - c
            walls.append(time.perf_counter() - w)
            before = children_cpu()
            if error_r >= 0:
                assert os.read(error_r, 512) == b"", "the helper could not start `true`"
                os.close(error_r)
            os.waitpid(pid, 0)  # (not timed)
            child_cpu += children_cpu() - before
            if how == "popen":
                child.returncode = 0
    walls.sort()
    return {
        "cpu_us": round(cpu / n * 1e6, 1),
        "child_cpu_us": round(child_cpu / n * 1e6, 1),
        "wall_mean_us": round(statistics.fmean(walls) * 1e6, 1),
        "wall_p90_us": round(walls[int(0.9 * (n - 1))] * 1e6, 1),
    }


def mkdirs(n: int, folder: Path) -> dict:
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        names = [os.path.join(tmp, f"d{k}") for k in range(n)]
        w, c = time.perf_counter(), time.process_time()
        for name in names:
            os.mkdir(name)
        return {
            "wall_us": round((time.perf_counter() - w) / n * 1e6, 1),
            "cpu_us": round((time.process_time() - c) / n * 1e6, 1),
        }


def per_call(fn, n: int = 20000) -> float:
    c = time.perf_counter()
    for k in range(n):
        fn(k)
    return round((time.perf_counter() - c) / n * 1e6, 2)


def spawn_figures(n: int, folder: Path, path: str) -> dict:
    helper = load_helper(path) if path else None
    return {
        "spawn_posix_spawn": best(lambda: starts(n, "posix_spawn", folder)),
        "spawn_popen": best(lambda: starts(n, "popen", folder)),
        "spawn_fork_as_the_reaper": best(lambda: starts(n, "fork", folder)),
        **({"spawn_start_helper": best(lambda: starts(n, "helper", folder, helper))} if helper else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=300)
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--spawns-only", action="store_true", help=argparse.SUPPRESS)  # (the lean process)
    parser.add_argument("--helper", default="", help=argparse.SUPPRESS)  # (the lean process's start helper)
    args = parser.parse_args()
    if args.spawns_only:
        print(json.dumps(spawn_figures(args.starts, args.dir, args.helper)))
        return
    from gpuyard.services.executor.start_helper import start_helper
    from gpuyard.shared.contracts.events.envelope import _ID_NAMESPACE, derived_id

    base = str(args.dir)
    for k in range(100):  # the two give the same ids
        assert derived_id("job", k, "attempt") == uuid.uuid5(_ID_NAMESPACE, f"job/{k}/attempt").hex
    lean = [
        sys.executable,
        "-I",
        "-S",
        __file__,
        "--spawns-only",
        "--starts",
        str(args.starts),
        "--dir",
        base,
    ]
    with tempfile.TemporaryDirectory() as built:
        helper = start_helper(Path(built))
        lean_figures = subprocess.run(
            [*lean, "--helper", helper or ""], check=True, capture_output=True, text=True
        )
    result = {
        **json.loads(lean_figures.stdout),
        "mkdir": best(lambda: mkdirs(500, args.dir)),
        "pathlib_path_us": min(
            per_call(lambda k: Path(base) / "jobs" / f"j{k}" / "attempt-1" / "replica-0" / "out.log")
            for _ in range(ROUNDS)
        ),
        "string_path_us": min(
            per_call(lambda k: f"{base}/jobs/j{k}/attempt-1/replica-0/out.log") for _ in range(ROUNDS)
        ),
        "derived_id_us": min(per_call(lambda k: derived_id("job", k, "attempt")) for _ in range(ROUNDS)),
        "uuid5_us": min(
            per_call(lambda k: uuid.uuid5(_ID_NAMESPACE, f"job/{k}/attempt").hex) for _ in range(ROUNDS)
        ),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
