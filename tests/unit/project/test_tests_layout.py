"""The unit tests mirror the source tree: each test file sits under the folder of what it tests
(tests/unit/services/<service>/, tests/unit/shared/<role>/, tests/unit/gpuyard/<part>/, tests/unit/benchmarks/),
and the tests of the project as a whole under tests/unit/project/. None sits directly in tests/unit/."""

from __future__ import annotations

from pathlib import Path

UNIT = Path(__file__).resolve().parents[1]


def test_no_test_file_sits_directly_in_tests_unit():
    flat = sorted(path.name for path in UNIT.glob("test_*.py"))
    assert not flat, (
        f"move these under the folder of what they test (tests/unit/<services|shared|gpuyard|project>/…): {flat}"
    )


def test_every_folder_of_the_unit_tests_is_a_package():
    """The tests import one another's helpers as `tests.unit.<folder>.<module>`."""
    folders = [
        p for p in UNIT.rglob("*") if p.is_dir() and p.name != "__pycache__" and "__pycache__" not in p.parts
    ]
    missing = sorted(str(p.relative_to(UNIT)) for p in folders if not (p / "__init__.py").exists())
    assert not missing, f"add an empty __init__.py to: {missing}"
