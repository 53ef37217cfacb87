"""The whole suite as `make test` runs it: two pytest processes side by side, one per core.

The integration and chaos tests (real nats-server, real `gpuyard up`, mostly waiting on processes and the
network) run in one process, everything else (unit, contract, fuzz and browser tests, and the Slurm backend's
integration tests: `MOVED`) in the other: each half keeps
the order and isolation of a plain `pytest` run, and the two halves take about as long as each other, so the
suite takes about half its serial time on two cores. A line every half minute says how far each half is; at
the end each half's own output follows (its failures, its skipped tests with their reasons, its slowest
tests), the one that failed last. The exit status is the first non-zero of the two.

    python tests/suite.py [PYTEST ARGS...]     # e.g. -x, -k name
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOVED = ["tests/integration/slurm"]
"""Integration tests that go with the other half, which would end first: the Slurm backend's (a real Slurm)."""
HALVES = {
    "integration": ["tests/integration", "tests/chaos", *(f"--ignore={path}" for path in MOVED)],
    "the rest": ["tests/unit", "tests/contract", "tests/fuzz", "tests/browser", "tests/gpu", *MOVED],
}
PYTEST = ["-q", "-rs", "--durations=15", "-p", "no:cacheprovider"]
PROGRESS_EVERY = 30.0
PERCENT = re.compile(rb"\[\s*(\d+)%\]")
NO_TESTS = 5
"""pytest's exit status when nothing was selected: a half that `-k` leaves empty has nothing to fail."""


@dataclass
class Half:
    name: str
    paths: list[str]
    log: Path
    proc: subprocess.Popen[bytes] = field(init=False)
    percent: int = 0

    def start(self, extra: list[str]) -> None:
        command = [sys.executable, "-m", "pytest", *PYTEST, *extra, *self.paths]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def progress(self) -> str:
        """How far it is: pytest's last percentage, or its end."""
        if (code := self.proc.poll()) is not None:
            said = {0: "passed", NO_TESTS: "nothing selected"}.get(code, f"failed ({code})")
            return f"{self.name}: {said}"
        found = PERCENT.findall(self.log.read_bytes()[-4096:])
        self.percent = max(self.percent, int(found[-1]) if found else 0)  # (its summary pushes them out)
        return f"{self.name}: {self.percent}%"


def main(extra: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="gpuyard-suite-") as folder:
        halves = [
            Half(name, paths, Path(folder) / f"{n}.log") for n, (name, paths) in enumerate(HALVES.items())
        ]
        started = time.monotonic()
        for half in halves:
            half.start(extra)
        try:
            wait(halves, started)
        finally:  # (interrupted: nothing of the suite outlives it)
            for half in halves:
                if half.proc.poll() is None:
                    half.proc.terminate()
                    half.proc.wait()
        for half in sorted(
            halves, key=lambda h: h.proc.returncode not in (0, NO_TESTS)
        ):  # the failed one last: CI shows the tail
            print(f"\n{'=' * 30} {half.name} ({' '.join(half.paths)}) {'=' * 30}", flush=True)
            sys.stdout.buffer.write(half.log.read_bytes())
            sys.stdout.flush()
        ended = " · ".join(half.progress() for half in halves)
        print(f"\nthe suite took {(time.monotonic() - started) / 60:.1f} min: {ended}")
        codes = [half.proc.returncode for half in halves]
        if all(code == NO_TESTS for code in codes):
            return NO_TESTS
        return next((code for code in codes if code not in (0, NO_TESTS)), 0)


def wait(halves: list[Half], started: float) -> None:
    """Until both halves end, say how far each is every PROGRESS_EVERY seconds (when that changed)."""
    said, report = "", started + PROGRESS_EVERY
    while any(half.proc.poll() is None for half in halves):
        time.sleep(0.5)
        if time.monotonic() >= report:
            report += PROGRESS_EVERY
            if (line := " · ".join(half.progress() for half in halves)) != said:
                print(f"[{(time.monotonic() - started) / 60:4.1f} min] {line}", flush=True)
                said = line


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
