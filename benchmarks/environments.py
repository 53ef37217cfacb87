"""A job's own environment (`environment: {pip: [...]}`, docs/environments.md), on a platform of its own: the
first build against `uv venv` + `uv pip install` of the same list by hand, then the start of a job whose
environment is cached against the same job with none.

    python benchmarks/environments.py               # 5 packages, 50 jobs of each kind
    python benchmarks/environments.py --jobs 5      # a quick look

Makes `--packages` tiny wheels in a folder of its own and builds from them alone (GPUYARD_ENVIRONMENT_FIND_LINKS,
GPUYARD_ENVIRONMENT_OFFLINE: no index is reached), then starts `gpuyard up --simulate-gpus 1` on free ports
(removed afterwards). The first build: a job with that list, its build's time as its log says it ("built
environment KEY in X s") and its placed→running; by hand: `uv venv --python <the same interpreter>` and
`uv pip install` of the same list with the same options into a temporary folder, with an empty uv cache of its
own (as the platform's first build had). Then jobs one at a time, each after the previous one ended,
alternating one with the environment (now cached) and one with none (with, without, with...), after `--warmup`
pairs that are not counted; both run `true`. From each job's events, followed on NATS as pipeline.py does:
submit→running and placed→running, in milliseconds, min / median / max per kind, and the median with the
environment minus the median without. Prints one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuyard.client import Client
from gpuyard.services.executor.environments.builder import uv_binary
from gpuyard.services.executor.environments.pythons import default_python, find_pythons
from gpuyard.shared.bus.credentials import credentials_path
from gpuyard.shared.runtime.service import event_loop_factory

# imported as benchmarks.environments (python -m, a test), or run as a script: its own folder first on the path
if __package__:
    from benchmarks.pairs import one_at_a_time, paired_figures
    from benchmarks.pipeline import NOOP, start_platform, stop_platform
    from tests.tinywheels import make_wheel
else:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from pairs import one_at_a_time, paired_figures
    from pipeline import NOOP, start_platform, stop_platform

    from tests.tinywheels import make_wheel

WITH, WITHOUT = "with_environment", "without"
PYTHONS = "/usr/local/bin:/usr/bin"


def wheels(folder: Path, count: int) -> list[str]:
    """`count` tiny wheels in `folder`: their names, the job's `pip` list."""
    names = [f"benchpkg{i}" for i in range(count)]
    for name in names:
        make_wheel(folder, name, body=f"VALUE = {name!r}\n" + "# padding\n" * 200)
    return names


def by_hand(pip: list[str], links: Path, python: str) -> float:
    """Seconds of `uv venv` + `uv pip install` of `pip` by hand, offline from `links`, an empty cache."""
    with tempfile.TemporaryDirectory(prefix="env-by-hand-") as tmp:
        env = {
            **os.environ,
            "UV_CACHE_DIR": f"{tmp}/cache",
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_NO_PROGRESS": "1",
        }
        uv, venv = uv_binary(), f"{tmp}/venv"
        start = time.perf_counter()
        subprocess.run(
            [uv, "venv", "--relocatable", "--python", python, venv], env=env, check=True, capture_output=True
        )
        install = [uv, "pip", "install", "--python", f"{venv}/bin/python", "--find-links", str(links)]
        subprocess.run([*install, "--offline", "--no-index", "--no-build", "--", *pip], env=env, check=True,
                       capture_output=True)  # fmt: skip
        return time.perf_counter() - start


def measure(
    args: argparse.Namespace, client: Client, tmp: Path, nats_url: str, pip: list[str], links: Path
) -> dict:
    python = default_python(find_pythons(PYTHONS))
    with_env = {**NOOP, "environment": {"pip": pip}}
    credentials = credentials_path(tmp / "data", "integrator")
    with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
        [(_, first)], tap = runner.run(one_at_a_time(client, nats_url, credentials, [(WITH, with_env)]))
        log = client.logs(first)
        built = re.search(r"built environment (\w+) in ([0-9.]+)s", log)
        if built is None:
            raise SystemExit(f"the first job built no environment: {log[-2000:]}")
        hand = by_hand(pip, links, python)
        order = [(WITH, with_env), (WITHOUT, NOOP)] * (args.warmup + args.jobs)
        done, tap2 = runner.run(one_at_a_time(client, nats_url, credentials, order))
    times = tap.times[first]
    return {
        "packages": len(pip),
        "python": python,
        "jobs_per_kind": args.jobs,
        "first_build": {
            "key": built[1],
            "build_s_as_logged": float(built[2]),
            "placed_to_running_ms": round((times["started"] - times["placed"]) * 1e3, 1),
            "by_hand_uv_venv_and_pip_install_s": round(hand, 3),
            "ratio_logged_build_to_by_hand": round(float(built[2]) / hand, 2),
        },
        **paired_figures(tap2.times, done[2 * args.warmup :], (WITH, WITHOUT)),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--packages", type=int, default=5, help="packages in the environment (default 5)")
    parser.add_argument("--jobs", type=int, default=50, help="jobs of each kind (default 50)")
    parser.add_argument("--warmup", type=int, default=1, help="pairs run first, not counted (default 1)")
    args = parser.parse_args()
    if args.jobs < 1 or args.warmup < 0 or args.packages < 1:
        parser.error("--jobs and --packages must be at least 1, --warmup at least 0")
    if default_python(find_pythons(PYTHONS)) is None:
        raise SystemExit(f"no system python3.N in {PYTHONS} to build environments from")
    links = Path(tempfile.mkdtemp(prefix="env-bench-wheels-"))
    pip = wheels(links, args.packages)
    os.environ.update(GPUYARD_ENVIRONMENT_FIND_LINKS=str(links), GPUYARD_ENVIRONMENT_OFFLINE="true")
    proc, client, tmp, nats_url = start_platform(1, None)
    try:
        result = measure(args, client, tmp, nats_url, pip, links)
    finally:
        stop_platform(proc, tmp)
        subprocess.run(["rm", "-rf", str(links)], check=False)
    print(json.dumps(result, indent=2))
    return 1 if result[WITH]["failed"] or result[WITHOUT]["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
