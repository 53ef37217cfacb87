"""The depth of the randomized tests and the API fuzz test's seed: in the run's header, at its end (`-q` hides
the header: `make test-deep` runs so), and beside a fuzz test's failure, so that a failure can be replayed
without `-s`."""

from __future__ import annotations

import pytest

from tests.fuzz.depth import DEPTH, DEPTH_VARIABLE, FUZZ_SEED, replay_line


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Shown when tests/fuzz is named on the command line (pytest asks only the conftests it loads before
    collecting)."""
    return [f"randomized tests: {DEPTH} ({DEPTH_VARIABLE})", replay_line()]


def pytest_terminal_summary(terminalreporter) -> None:
    if FUZZ_SEED is not None:  # (a derandomized run needs no replay line)
        terminalreporter.write_line(replay_line())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed:
        report.sections.append(("API fuzzing", replay_line()))
    return report
