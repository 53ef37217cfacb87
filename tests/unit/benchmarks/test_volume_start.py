"""benchmarks/volume_start.py's own arithmetic: the interleaved order, the files a volume is filled with, and the
figures from the jobs' event times (the platform run itself is the benchmark's, not a unit test's)."""

from __future__ import annotations

from benchmarks import volume_start
from benchmarks.volume_start import PART, WITH, WITHOUT


def test_jobs_alternate_with_and_without_the_volume():
    assert volume_start.interleaved(2) == [WITH, WITHOUT, WITH, WITHOUT]
    assert volume_start.SPECS[WITH]["volumes"][0]["read_only"] is True
    assert "volumes" not in volume_start.SPECS[WITHOUT]


def test_the_volume_is_filled_in_files_of_at_most_a_part():
    assert volume_start.parts(50_000_000) == [50_000_000]
    assert volume_start.parts(2 * PART + 5) == [PART, PART, 5]
    assert sum(len(c) for c in volume_start.random_chunks(3 * (1 << 20) + 7)) == 3 * (1 << 20) + 7


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
    out = volume_start.figures(seen, jobs)
    assert out[WITH]["jobs"] == 3 and out[WITH]["failed"] == 0
    assert out[WITHOUT]["jobs"] == 3 and out[WITHOUT]["failed"] == 1
    assert out[WITH]["placed_to_running_ms"] == {"min": 10.0, "median": 20.0, "max": 30.0}
    assert out[WITHOUT]["placed_to_running_ms"] == {"min": 5.0, "median": 6.0, "max": 7.0}
    assert out["with_minus_without_median_ms"]["placed_to_running_ms"] == 14.0
    assert out["with_minus_without_median_ms"]["submit_to_running_ms"] == 22.0 - 7.0


def test_how_the_volume_was_mounted_is_read_from_the_notes():
    link = volume_start.READ_ONLY_NOT_ENFORCED.format(names="bench", why="no namespaces")
    assert volume_start.mounted_as([link]).startswith("a link")
    assert volume_start.mounted_as(["cpu and memory limits not enforced"]).startswith("bound read-only")
