"""benchmarks/volume_start.py's own arithmetic: the interleaved order, the files a volume is filled with, how the
volume was mounted (the platform run itself is the benchmark's, not a unit test's)."""

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


def test_how_the_volume_was_mounted_is_read_from_the_notes():
    link = volume_start.READ_ONLY_NOT_ENFORCED.format(names="bench", why="no namespaces")
    assert volume_start.mounted_as([link]).startswith("a link")
    assert volume_start.mounted_as(["cpu and memory limits not enforced"]).startswith("bound read-only")
