"""The alert rules file: the defaults, what a file changes, and the refusals (one line, exit status 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuyard.services.monitor.rules import (
    APPLICATION_XIDS,
    Rules,
    RulesError,
    load_rules,
    parse_rules,
    rules_refusal,
)
from gpuyard.shared.settings.common import EXIT_REFUSED
from gpuyard.shared.settings.monitor import MonitorSettings

ROOT = Path(__file__).resolve().parents[4]
EXAMPLE = ROOT / "deploy" / "alert-rules.example.yaml"


def test_no_file_gives_the_defaults():
    rules = load_rules(None)
    assert rules == Rules()
    assert rules.gpu_idle.for_ == 1800 and rules.gpu_idle.below_pct == 5
    assert rules.gpu_temperature.above_c == 85 and rules.gpu_temperature.clear_below_c == 80
    assert tuple(rules.gpu_xid.application_xids) == APPLICATION_XIDS == (13, 31, 43, 45, 68, 109)
    assert rules.node_lost.severity == "critical" and rules.job_waiting.for_ == 1800


def test_a_file_changes_only_what_it_names(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n  gpu_temperature:\n    above_c: 90\n    for: 2m\n    severity: critical\n"
        "  job_waiting:\n    enabled: false\n  gpu_idle:\n"
    )
    rules = load_rules(path)
    assert rules.gpu_temperature.above_c == 90 and rules.gpu_temperature.for_ == 120
    assert rules.gpu_temperature.severity == "critical" and rules.gpu_temperature.clear_below_c == 80
    assert not rules.job_waiting.enabled and rules.gpu_idle == Rules().gpu_idle
    assert rules.gpu_power == Rules().gpu_power
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert load_rules(empty) == Rules()


def test_the_example_file_loads_and_says_what_the_defaults_are():
    assert load_rules(EXAMPLE) == Rules()


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("rules:\n  gpu_hot: {above_c: 90}\n", "unknown rule 'gpu_hot'; the rules are gpu_idle,"),
        (
            "rules:\n  gpu_temperature: {above: 90}\n",
            "gpu_temperature.above: unknown field; gpu_temperature has",
        ),
        ("rules:\n  gpu_idle: {for: soon}\n", "gpu_idle.for: cannot read 'soon' as a duration"),
        (
            "rules:\n  gpu_idle: {below_pct: 150}\n",
            "gpu_idle.below_pct: Input should be less than or equal to 100",
        ),
        ("rules:\n  gpu_idle: {severity: loud}\n", "gpu_idle.severity: Input should be 'info', 'warning' or"),
        (
            "rules:\n  gpu_temperature: {above_c: 80, clear_below_c: 85}\n",
            "clear_below_c must be at most above_c",
        ),
        ("rules:\n  gpu_power: {above_watts: 300}\n", "above_watts and clear_below_watts go together"),
        ("alerts:\n  gpu_idle: {}\n", "the file holds one mapping, 'rules:', not unknown key(s) alerts"),
        ("- gpu_idle\n", "the file holds one mapping, 'rules:', not a list"),
        ("rules: [gpu_idle]\n", "'rules' must map rule names"),
        ("rules:\n  gpu_idle: 5\n", "rule gpu_idle: give its fields as a mapping"),
        ("rules:\n  gpu_idle: {for: 1m\n", "not valid YAML"),
    ],
)
def test_bad_files_are_refused_with_one_line_naming_the_problem(tmp_path, text, words):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(RulesError) as refused:
        load_rules(path)
    message = str(refused.value)
    assert words in message and "\n" not in message and message.startswith(f"alert rules {path}")


def test_a_missing_file_is_refused():
    with pytest.raises(RulesError, match="cannot read it"):
        load_rules(Path("/no/such/rules.yaml"))


def test_zero_times_are_allowed_and_negative_ones_refused():
    assert (
        parse_rules({"rules": {"gpu_temperature": {"for": 0, "keep_firing_for": "0s"}}}).gpu_temperature.for_
        == 0
    )
    with pytest.raises(RulesError, match="gpu_temperature.for"):
        parse_rules({"rules": {"gpu_temperature": {"for": -5}}})


def test_the_preflight_names_the_refusal(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  gpu_idle: {treshold: 3}\n")
    assert "gpu_idle.treshold: unknown field" in rules_refusal(MonitorSettings(alert_rules=path))
    assert rules_refusal(MonitorSettings()) is None


def test_the_monitor_exits_with_status_2_and_one_line_on_a_bad_rules_file(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text("rules:\n  gpu_idle: {treshold: 3}\n")
    done = subprocess.run(
        [sys.executable, "-m", "gpuyard.services.monitor.alertservice", "--alert-rules", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "GPUYARD_DATA_DIR": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == EXIT_REFUSED, done.stderr
    [line] = [x for x in done.stderr.splitlines() if "refuses" in x]
    assert "gpu_idle.treshold: unknown field" in line
