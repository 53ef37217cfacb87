"""How hard the randomized tests search, chosen once for the whole run by GPUYARD_TEST_DEPTH.

- `quick` (the default: `make test`): the scheduler's property tests on small clusters and queues with tens of
  examples, and the API fuzz test, both derandomized (the same inputs every run: `make test` fails for a change,
  never for a draw).
- `deep` (`make test-deep`): clusters up to 64 nodes, queues up to 500 jobs, thousands of examples, and the API
  fuzz test with a fresh seed each run, shown in the header and beside a failure; GPUYARD_FUZZ_SEED=N replays
  that run's inputs (at either depth).

The property tests (`tests/unit/services/scheduler/test_properties.py`) and the fuzz test (`tests/fuzz/`) both read it
from here. Reading the environment creates nothing: a test module that imports this stays free of side effects.
"""

from __future__ import annotations

import os
import random
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings

DEPTH_VARIABLE = "GPUYARD_TEST_DEPTH"
SEED_VARIABLE = "GPUYARD_FUZZ_SEED"
DEPTHS = ("quick", "deep")


def _depth() -> str:
    depth = os.environ.get(DEPTH_VARIABLE) or "quick"
    if depth not in DEPTHS:
        raise pytest.UsageError(f"{DEPTH_VARIABLE} must be one of {', '.join(DEPTHS)}, not {depth!r}")
    return depth


def _fuzz_seed(deep: bool) -> int | None:
    given = os.environ.get(SEED_VARIABLE)
    if given:
        try:
            return int(given)
        except ValueError:
            raise pytest.UsageError(f"{SEED_VARIABLE} must be an integer, not {given!r}") from None
    return random.SystemRandom().randrange(1 << 32) if deep else None  # (not the global generator's state)


DEPTH = _depth()
DEEP = DEPTH == "deep"
FUZZ_SEED = _fuzz_seed(DEEP)
"""The API fuzz test's seed; None: derandomized."""

# What every property test shares, at both depths; each adds its own number of examples (`search`). No
# deadline: a 500-job cycle on a busy machine is slow, and how fast it is belongs in the benchmarks. The example
# database is hypothesis' default: a failure found once is tried first on the next run. `print_blob`: a failure
# also prints the `@reproduce_failure` line that replays it.
PROPERTIES = settings(deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow])

T = TypeVar("T")


def search(quick: int, deep: int) -> settings:
    """The hypothesis settings of a property test: `quick` examples in the quick run, the same ones every run (a
    CI that fails, fails for a change, never for a draw), and `deep` fresh ones in the deep run, which searches."""
    return settings(PROPERTIES, max_examples=deep if DEEP else quick, derandomize=not DEEP)


def pick(quick: T, deep: T) -> T:
    """`quick` in the quick run, `deep` in the deep one (a size, a count)."""
    return deep if DEEP else quick


def replay_line() -> str:
    """How to get this run's fuzz inputs again (shown in the header and beside a failure)."""
    if FUZZ_SEED is None:
        return "API fuzzing: derandomized (the same inputs every run)"
    return (
        f"API fuzzing: seed {FUZZ_SEED}; replay with {DEPTH_VARIABLE}={DEPTH} {SEED_VARIABLE}={FUZZ_SEED} "
        f".venv/bin/pytest tests/fuzz"
    )
