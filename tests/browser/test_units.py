"""The dashboard writes sizes as the API and the CLI do: its `bytes` (static/app.js) mirrors
`gpuyard.shared.contracts.units.format_size`, checked here value by value in the browser."""

from __future__ import annotations

import pytest

pytest.importorskip("playwright")

from gpuyard.shared.contracts.units import format_size  # noqa: E402

SIZES = [
    0, 1, 900, 1000, 1023, 1024, 1536, 10**6, 256 * 10**6, 256 * 2**20, 255_999_999, 1536 * 2**20, 2**30,
    16 * 2**30, 17_179_869_184 - 1, int(1.5 * 2**30), 24_683_652 * 1024, 10**12, 3 * 2**40, 12_000 * 2**40,
    80 * 10**9, 123_456_789,
]  # fmt: skip


def test_sizes_are_written_as_shared_units_writes_them(dashboard):
    page = dashboard("vision").page
    page.goto("/submit")
    written = page.evaluate(
        """async (sizes) => {
          const { bytes } = await import("/static/dashboard/app.js");  // (the page's own instance)
          return sizes.map(bytes);
        }""",
        SIZES,
    )
    assert dict(zip(SIZES, written, strict=True)) == {n: format_size(n) for n in SIZES}
