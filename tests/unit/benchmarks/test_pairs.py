"""benchmarks/pairs.py: the figures of two kinds of job from their event times, per kind and the difference of
the medians (a job that never started counted as failed, not in the figures)."""

from __future__ import annotations

from benchmarks.pairs import paired_figures

WITH, WITHOUT = "with", "without"


def test_figures_per_kind_and_the_difference_of_medians():
    def times(placed: float, started: float) -> dict[str, float]:
        return {"submitted": 100.0, "placed": 100.0 + placed, "started": 100.0 + started, "succeeded": 101.0}

    seen = {
        "a": times(0.001, 0.011),  # with: placed->running 10, 20, 30 ms
        "b": times(0.001, 0.006),  # without: 5, 7 ms
        "c": times(0.002, 0.022),
        "d": times(0.001, 0.008),
        "e": times(0.003, 0.033),
        "f": {"submitted": 100.0, "placed": 100.001, "failed": 100.002},  # without, never started
    }
    jobs = [(WITH, "a"), (WITHOUT, "b"), (WITH, "c"), (WITHOUT, "d"), (WITH, "e"), (WITHOUT, "f")]
    out = paired_figures(seen, jobs, (WITH, WITHOUT))
    assert out[WITH]["jobs"] == 3 and out[WITH]["failed"] == 0
    assert out[WITHOUT]["jobs"] == 3 and out[WITHOUT]["failed"] == 1
    assert out[WITH]["placed_to_running_ms"] == {"min": 10.0, "median": 20.0, "max": 30.0}
    assert out[WITHOUT]["placed_to_running_ms"] == {"min": 5.0, "median": 6.0, "max": 7.0}
    assert out["with_minus_without_median_ms"]["placed_to_running_ms"] == 14.0
    assert out["with_minus_without_median_ms"]["submit_to_running_ms"] == 22.0 - 7.0
