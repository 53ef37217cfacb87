"""Nothing dead in gpuyard/, services/ and shared/: vulture finds no function, method, class, property,
constant, local variable, import or unreachable code that nothing uses, at its lowest confidence for them
(60%: a dead function is found at no higher one), but for what tests/unit/project/vulture_whitelist.py lists with the
reason it stays.

Fields (variables in a class body: pydantic and dataclass fields, enum members) and attributes set on objects
are left out: serialization, frameworks and tests read them, which vulture cannot see. The same reading of a
small tree of its own proves that the check finds a dead function, so that it cannot pass for finding nothing.
To see every finding: `vulture gpuyard services shared --min-confidence 60`."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path

from vulture import Vulture

from tests.unit.project.vulture_whitelist import IGNORE_DECORATORS, WHITELIST

ROOT = Path(__file__).resolve().parents[3]
FOLDERS = ("gpuyard", "services", "shared")
MIN_CONFIDENCE = 60
NOT_CHECKED = {"attribute"}  # (`obj.x = ...`: read by what vulture cannot see)


@cache
def _class_body_lines(path: Path) -> frozenset[int]:
    """The lines of assignments directly in a class body (fields, enum members) in the file at `path`."""
    tree = ast.parse(path.read_text(), str(path))
    return frozenset(
        stmt.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        for stmt in node.body
        if isinstance(stmt, ast.Assign | ast.AnnAssign)
    )


def findings(root: Path, folders: Iterable[str]) -> list[tuple[str, str, int, str]]:
    """(file relative to `root`, name, line, vulture's message) of what vulture finds unused under `folders`
    of `root`, fields and attributes aside."""
    scan = Vulture(ignore_decorators=IGNORE_DECORATORS)
    scan.scavenge([str(root / folder) for folder in folders])
    found = []
    for item in scan.get_unused_code(min_confidence=MIN_CONFIDENCE):
        path = Path(item.filename).resolve()
        if item.typ in NOT_CHECKED:
            continue
        if item.typ == "variable" and item.first_lineno in _class_body_lines(path):
            continue
        message = f"{item.message} ({item.confidence}% confidence)"
        found.append((path.relative_to(root).as_posix(), item.name, item.first_lineno, message))
    return sorted(found)


def check(
    root: Path, folders: Iterable[str], whitelist: Mapping[tuple[str, str], str]
) -> tuple[list[str], list[tuple[str, str]]]:
    """(what is dead: 'file:line: message' of each finding the whitelist does not name, the whitelist's entries
    that name no finding)."""
    found = findings(root, folders)
    dead = [
        f"{file}:{line}: {message}" for file, name, line, message in found if (file, name) not in whitelist
    ]
    named = {(file, name) for file, name, _, _ in found}
    return dead, sorted(set(whitelist) - named)


def test_nothing_in_the_platform_is_dead():
    dead, stale = check(ROOT, FOLDERS, WHITELIST)
    assert not dead, (
        "unused (remove it, or say in tests/unit/project/vulture_whitelist.py why it stays):\n"
        + "\n".join(dead)
    )
    assert not stale, (
        f"tests/unit/project/vulture_whitelist.py names what vulture no longer finds: remove {stale}"
    )


SAMPLE = """
import enum

from pydantic import BaseModel, model_validator

LIMIT = 3
UNUSED_LIMIT = 4


class Color(enum.Enum):
    RED = 1  # an enum member: a field, not checked


class Out(BaseModel):
    size: int = 0  # a pydantic field: not checked

    @model_validator(mode="after")
    def _checked(self):
        return self


class Engine:
    def __init__(self):
        self.started = False  # an attribute: not checked

    def run(self):
        return LIMIT

    def stop(self):
        return None


def used() -> int:
    return Engine().run() + Out().size


def dead_function() -> int:
    return 1


def kept_by_name() -> None:
    pass


print(used(), Color.RED)
"""


def test_the_check_finds_a_dead_function_and_a_stale_whitelist_entry(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(textwrap.dedent(SAMPLE))
    assert [(file, name) for file, name, _, _ in findings(tmp_path, ["pkg"])] == [
        ("pkg/mod.py", "UNUSED_LIMIT"),
        ("pkg/mod.py", "dead_function"),
        ("pkg/mod.py", "kept_by_name"),
        ("pkg/mod.py", "stop"),
    ]
    dead, stale = check(
        tmp_path, ["pkg"], {("pkg/mod.py", "kept_by_name"): "why", ("pkg/mod.py", "gone"): "removed"}
    )
    assert [line.split(": ", 1)[1] for line in dead] == [
        "unused variable 'UNUSED_LIMIT' (60% confidence)",
        "unused function 'dead_function' (60% confidence)",
        "unused method 'stop' (60% confidence)",
    ]
    assert stale == [("pkg/mod.py", "gone")]
