"""The depth of the randomized tests in the run's header, and the fuzz seed beside a fuzz test's failure (no
`-s` needed to see how to replay it)."""

from __future__ import annotations

import pytest

from tests.fuzz.depth import DEPTH, DEPTH_VARIABLE, replay_line


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Shown when tests/fuzz is named on the command line (`make test-deep`, `pytest tests/fuzz`): pytest asks
    only the conftests it loads before collecting."""
    return [f"randomized tests: {DEPTH} ({DEPTH_VARIABLE})", replay_line()]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed:
        report.sections.append(("API fuzzing", replay_line()))
    return report
