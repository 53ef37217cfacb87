"""README.md and docs/*.md speak of the product, not of how it was built: they name no development session
("session 11") and no issue number ("issue 24, item 8"). A figure is identified by its command, its date and
its commit; a change by what it changed."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# "session 11", "Issue 24": also where a line break falls between the word and the number
DEVELOPMENT_TALK = re.compile(r"\b(session\s+[0-9]+|issue\s+[0-9]+)\b", re.IGNORECASE)


def development_talk(doc: Path) -> list[str]:
    """Each line of `doc` that names a development session or an issue number, as `file:line: text`."""
    text = doc.read_text()
    lines = text.splitlines()
    numbers = sorted({text.count("\n", 0, match.start()) + 1 for match in DEVELOPMENT_TALK.finditer(text)})
    return [f"{doc.relative_to(ROOT)}:{number}: {lines[number - 1].strip()}" for number in numbers]


def test_the_docs_are_there_to_check():
    assert (ROOT / "README.md").is_file()
    assert len(DOCS) > 5


def test_the_docs_name_no_development_session_or_issue():
    found = [line for doc in DOCS for line in development_talk(doc)]
    assert not found, "development sessions or issue numbers named in the product docs:\n" + "\n".join(found)


def test_the_check_finds_what_it_looks_for(tmp_path, monkeypatch):
    """The pattern catches the forms the docs used, whatever their case, and leaves alone the product's own
    words (an ONNX Runtime session, `session.run`, the session cookie)."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "**Session 12 (2026-11-27): faster.**\n"
        "an ONNX Runtime session and `session.run`, 12 sessions held\n"
        "## The reaper (issue 24, item 8)\n"
        "the session cookie; SESSION 3 ran\n"
        "against 1.7 per job in session\n"
        "  15; and 3 sessions\n"
    )
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    assert development_talk(doc) == [
        "doc.md:1: **Session 12 (2026-11-27): faster.**",
        "doc.md:3: ## The reaper (issue 24, item 8)",
        "doc.md:4: the session cookie; SESSION 3 ran",
        "doc.md:5: against 1.7 per job in session",
    ]
