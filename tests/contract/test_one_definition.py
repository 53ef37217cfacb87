"""Each contract has exactly one definition: the docs, the scheduler and the other services use it, and no
module spells out what belongs to it (a subject, an event type, a stream wildcard)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpuyard.services.scheduler.core.placement import POLICIES, make_policy
from gpuyard.services.scheduler.main import LIVE_STATES
from gpuyard.shared.events import STREAMS, Subject, Wildcard, type_of
from gpuyard.shared.jobstate import TERMINAL_STATES, JobState
from gpuyard.shared.policies import Policy
from gpuyard.shared.reasons import Fit, PendingCode

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("shared", "services", "gpuyard")
EVENTS_MODULE = ROOT / "shared" / "events.py"
NATS_WILDCARD = re.compile(r"^[a-z_]+\.(>|\*)$")


# ------------------------------------------------------------------------------------------ pending codes
def reason_table(text: str) -> list[tuple[str, str]]:
    """(code, rank) of each row of the reason-code table in docs/scheduler.md."""
    rows = text.split("| code | rank | example message |\n|---|---|---|\n", 1)[1].split("\n\n", 1)[0]
    return [
        (cells[1].strip().strip("`"), cells[2].strip())
        for cells in (line.split("|") for line in rows.splitlines())
    ]


def test_scheduler_doc_lists_every_pending_code_once_with_its_rank():
    rows = reason_table((ROOT / "docs" / "scheduler.md").read_text())
    assert [code for code, _ in rows] == [code.value for code in PendingCode], "every code, in enum order"
    assert {code: rank for code, rank in rows} == {code.value: code.rank.name for code in PendingCode}


def test_reason_table_reader_sees_a_wrong_rank():
    text = "| code | rank | example message |\n|---|---|---|\n| `preempting` | FIT | x |\n\nmore"
    assert reason_table(text) == [("preempting", "FIT")]
    assert Fit[reason_table(text)[0][1]] != PendingCode.PREEMPTING.rank


# ------------------------------------------------------------------------------------------ states, policies
def test_the_scheduler_reads_every_state_that_is_not_terminal():
    assert set(LIVE_STATES) == set(JobState) - TERMINAL_STATES
    assert all(type(state) is str for state in LIVE_STATES)  # plain values for the store's query


def test_every_policy_has_an_implementation_and_nothing_else_does():
    assert set(POLICIES) == set(Policy)
    for policy in Policy:
        assert make_policy(policy.value).name is policy


# ------------------------------------------------------------------------------------------ subjects
def owned_by_events_module() -> set[str]:
    """The strings only shared/events.py may write: subjects, CloudEvents types, stream subjects."""
    return (
        {s.value for s in Subject}
        | {type_of(s) for s in Subject}
        | {w.value for w in Wildcard}
        | {subject for stream in STREAMS for subject in stream.subjects}
    )


def subject_literals(source: str, owned: set[str]) -> list[tuple[int, str]]:
    """(line, text) of each string constant in `source` that is a subject, an event type or a NATS wildcard."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and (node.value in owned or NATS_WILDCARD.match(node.value))
    ]


def product_modules() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py") if p != EVENTS_MODULE)


def test_no_module_but_events_spells_a_subject_a_type_or_a_wildcard():
    owned = owned_by_events_module()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in product_modules()
        for line, text in subject_literals(path.read_text(), owned)
    ]
    assert not found, "use gpuyard.shared.events (Subject, Wildcard, type_of) instead of:\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    ("source", "literal"),
    [
        ('SUBJECTS = ["job.placed"]', "job.placed"),
        ('bus.watch("job.>", handler)', "job.>"),
        ('filter = "gpu.*"', "gpu.*"),
        ('kind = "io.gpuyard.node.heartbeat"', "io.gpuyard.node.heartbeat"),
    ],
)
def test_the_subject_check_finds_a_literal(source, literal):
    assert subject_literals(source, owned_by_events_module()) == [(1, literal)]


def test_the_subject_check_leaves_other_strings_alone():
    source = 'x = f"deadletter.{durable}"\ny = "job placed"\nz = "jobs.placed.count"'
    assert subject_literals(source, owned_by_events_module()) == []
    assert len(product_modules()) > 50  # it does look at the product's modules
