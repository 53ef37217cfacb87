"""benchmarks/rounds.py reads the figures a benchmark printed: the JSON after its progress lines, keys that
contain dots (process names), list indexes."""

from __future__ import annotations

import pytest

from benchmarks import rounds


def test_the_json_after_progress_lines_is_read():
    out = 'platform in /tmp/x\n[progress 50%]\n{\n  "rate": 12.5,\n  "cpu": {"gpu.scheduler": 1.5}\n}\n'
    doc = rounds.parse_json_tail(out)
    assert rounds.pick(doc, "rate") == 12.5
    assert rounds.pick(doc, "cpu.gpu.scheduler") == 1.5
    assert rounds.pick(rounds.parse_json_tail('[{"a": 1}, {"a": {"b": 2}}]'), "1.a.b") == 2
    with pytest.raises(KeyError):
        rounds.pick(doc, "cpu.gpu.executor")
    with pytest.raises(ValueError):
        rounds.parse_json_tail("no figures\n")


def test_summary_is_min_median_max():
    assert rounds.summary([3.0, 1.0, 2.0, 10.0, 4.0]) == {"min": 1.0, "median": 3.0, "max": 10.0, "runs": 5}
