"""`make test` runs the suite in two halves side by side (tests/suite.py): every folder of tests is in exactly
one half, so that nothing is left out of CI when a folder is added."""

from __future__ import annotations

from pathlib import Path

from tests.suite import HALVES

TESTS = Path(__file__).resolve().parents[2]


def test_every_folder_of_tests_is_in_exactly_one_half():
    """Each top folder is named by one half; a folder inside one that its half leaves out (`--ignore=`) is
    named by the other half, and one named by a half is left out by the other."""
    folders = sorted(f"tests/{d.name}" for d in TESTS.iterdir() if d.is_dir() and any(d.rglob("test_*.py")))
    named = [path for paths in HALVES.values() for path in paths if not path.startswith("--")]
    assert sorted(path for path in named if path.count("/") == 1) == folders
    ignored = [
        path.removeprefix("--ignore=") for paths in HALVES.values() for path in paths if path[:2] == "--"
    ]
    assert sorted(ignored) == sorted(path for path in named if path.count("/") > 1)
    for paths in HALVES.values():
        assert not any(path in paths for path in ignored if f"--ignore={path}" in paths)
