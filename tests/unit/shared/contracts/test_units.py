"""One rendering of sizes and counts: in the unit people wrote, and never '1 GPUs'."""

from __future__ import annotations

import pytest

from gpuyard.shared.contracts.units import count_text, format_size, parse_size


@pytest.mark.parametrize(
    ("written", "shown"),
    [
        ("256MB", "256 MB"),
        ("16GiB", "16 GiB"),
        ("1GB", "1 GB"),
        ("1536MiB", "1536 MiB"),
        (900, "900 B"),
        (0, "0 B"),
    ],
)
def test_a_size_is_shown_in_the_unit_it_was_written_in(written, shown):
    assert format_size(parse_size(written)) == shown


def test_a_size_no_unit_divides_has_three_figures():
    assert format_size(1234567) == "1.18 MiB"
    assert format_size(int(999.7 * 2**20)) == "1000 MiB"  # three figures would round to '1e+03'


@pytest.mark.parametrize(
    ("n", "text"), [(1, "1 GPU"), (2, "2 GPUs"), (0.5, "0.5 GPU"), (0, "0 GPUs"), (1.5, "1.5 GPUs")]
)
def test_a_count_takes_the_plural_only_when_it_should(n, text):
    assert count_text(n, "GPU") == text
