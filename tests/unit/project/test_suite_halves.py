"""`make test` runs the suite in two halves side by side (tests/suite.py): every folder of tests is in exactly
one half, so that nothing is left out of CI when a folder is added."""

from __future__ import annotations

from pathlib import Path

from tests.suite import HALVES

TESTS = Path(__file__).resolve().parents[2]


def test_every_folder_of_tests_is_in_exactly_one_half():
    folders = sorted(f"tests/{d.name}" for d in TESTS.iterdir() if d.is_dir() and any(d.rglob("test_*.py")))
    named = sorted(path for paths in HALVES.values() for path in paths)
    assert named == folders
