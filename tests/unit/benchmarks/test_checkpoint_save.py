"""benchmarks/checkpoint_save.py at a tiny size: both sides save what they are given, the runs interleave, every
file is removed after its run, and the environment is left as it was. No timing thresholds."""

from __future__ import annotations

import os

import pytest

from benchmarks import checkpoint_save
from gpuyard import checkpoint


def test_bytes_are_saved_both_ways_and_removed(tmp_path, monkeypatch):
    monkeypatch.delenv(checkpoint.DIR_VARIABLE, raising=False)
    monkeypatch.setenv("GPUYARD_JOB_ID", "not-this-one")
    result = checkpoint_save.measure(4096, 3, raw=True, drop=False, where=tmp_path)
    for side in checkpoint_save.SIDES:
        assert len(result[side]["all_seconds"]) == 3
        assert result[side]["file_bytes"] == 4096
        assert 0 <= result[side]["seconds"]["min"] <= result[side]["seconds"]["max"]
        assert list((tmp_path / side).iterdir()) == []  # (each run's file removed; no temporary left)
    assert result["page_cache_dropped"] is False and "note" in result
    assert checkpoint.DIR_VARIABLE not in os.environ and os.environ["GPUYARD_JOB_ID"] == "not-this-one"


def test_a_torch_state_dict_is_saved_both_ways(tmp_path):
    pytest.importorskip("torch")
    result = checkpoint_save.measure(1 << 16, 1, raw=False, drop=False, where=tmp_path)
    assert result["gpuyard"]["file_bytes"] == result["plain"]["file_bytes"] > 1 << 16
