"""A reason's numbers as people read them: byte counts as sizes (a node's memory, read in KiB, is not
'24683652 KiB'), other numbers without exponents."""

from __future__ import annotations

import pytest

from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.reporting.why import details_text


@pytest.mark.parametrize(
    ("size", "shown"),
    [
        (24683652 * 1024, "23.5 GiB"),  # a node's MemTotal, in KiB
        (1536 << 20, "1536 MiB"),  # as written
        (256_000_000, "256 MB"),
        (16 << 30, "16 GiB"),
        (20_000 << 40, "20000 TiB"),
        (1234567, "1.18 MiB"),
    ],
)
def test_a_size_is_written_in_its_unit_with_four_digits_at_most_else_three_figures(size, shown):
    assert format_size(size) == shown


def test_why_shows_byte_counts_as_sizes_and_other_numbers_compactly():
    details = {
        "cpus": 1.0,
        "memory": 2.56e8,
        "gpu_memory": 2 << 30,
        "best_free_memory": 24683652 * 1024.0,
        "largest_free_share": 0.25,
        "free_cpus": 1 / 3,
        "replicas": 4,
        "not_before": 1712345678.5,
        "nodes": ["a", "b"],
    }
    assert details_text(details) == (
        "cpus=1 · memory=256 MB · gpu_memory=2 GiB · best_free_memory=23.5 GiB · largest_free_share=0.25 · "
        "free_cpus=0.333 · replicas=4 · not_before=1712345678.5 · nodes=a, b"
    )
