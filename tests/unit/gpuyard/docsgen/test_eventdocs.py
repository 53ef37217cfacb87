from pathlib import Path

from gpuyard.docsgen.events import render

DOC = Path(__file__).resolve().parents[4] / "docs" / "events.md"


def test_docs_events_md_matches_the_code():
    assert DOC.read_text() == render(), (
        "docs/events.md drifted: run `python -m gpuyard.docsgen.events > docs/events.md`"
    )


def test_every_subject_is_documented_with_an_example():
    text = render()
    from gpuyard.shared.contracts.events.subjects import Subject

    for subject in Subject:
        assert f"### `{subject.value}`" in text
        assert f'"type": "io.gpuyard.{subject.value}"' in text
