"""Each contract has exactly one definition: the docs, the scheduler and the other services use it, and no
module spells out what belongs to it (a subject, an event type, a stream wildcard, a set of job states, an
alert kind, an alert severity, a stop's reason, a preemption's cause, an attempt's outcome)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from gpuyard.services.monitor.rules import KINDS, Rules
from gpuyard.shared.contracts.events.alerts import AlertKind, AlertSeverity
from gpuyard.shared.contracts.events.envelope import type_of
from gpuyard.shared.contracts.events.subjects import STREAMS, Subject, Wildcard
from gpuyard.shared.contracts.jobstate import (
    ACTIVE_STATES,
    LIVE_STATES,
    TERMINAL_STATES,
    TRANSITIONS,
    JobState,
    in_order,
    state_values,
)
from gpuyard.shared.contracts.policies import Policy
from gpuyard.shared.contracts.reasons import Fit, PendingCode
from gpuyard.shared.contracts.stops import AttemptOutcome, PreemptionCause, StopReason
from gpuyard.shared.scheduling.placement import POLICIES, make_policy

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("shared", "services", "gpuyard")
EVENTS_MODULE = ROOT / "shared" / "contracts" / "events"  # (a package: one module per family)
JOBSTATE_MODULE = ROOT / "shared" / "contracts" / "jobstate.py"
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
def test_the_live_states_are_those_an_event_may_still_arrive_in():
    arrive_in = {state for states, _ in TRANSITIONS.values() for state in states}
    lead_to = {state for _, state in TRANSITIONS.values() if state is not None}
    assert (
        in_order(LIVE_STATES) == in_order(arrive_in) == [JobState.QUEUED, JobState.PLACED, JobState.RUNNING]
    )
    assert in_order(TERMINAL_STATES) == in_order(lead_to - arrive_in) == in_order(set(JobState) - LIVE_STATES)
    assert [state for state in JobState if state.terminal] == in_order(TERMINAL_STATES)
    assert in_order(ACTIVE_STATES) == [JobState.PLACED, JobState.RUNNING]
    assert state_values(LIVE_STATES) == ["queued", "placed", "running"]
    assert all(
        type(state) is str for state in state_values(LIVE_STATES)
    )  # plain values for the store's query


def test_every_policy_has_an_implementation_and_nothing_else_does():
    assert set(POLICIES) == set(Policy)
    for policy in Policy:
        assert make_policy(policy.value).name is policy


# ------------------------------------------------------------------------------------------ subjects
def owned_by_events_module() -> set[str]:
    """The strings only shared/contracts/events/ may write: subjects, CloudEvents types, stream subjects."""
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


def product_modules(definition: Path = EVENTS_MODULE) -> list[Path]:
    """The product's modules but `definition`, the one that may spell what is checked."""
    return sorted(
        p
        for top in PRODUCT
        for p in (ROOT / top).rglob("*.py")
        if p != definition and definition not in p.parents
    )


def test_no_module_but_events_spells_a_subject_a_type_or_a_wildcard():
    owned = owned_by_events_module()
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in product_modules()
        for line, text in subject_literals(path.read_text(), owned)
    ]
    assert not found, (
        "use gpuyard.shared.contracts.events (Subject, Wildcard, type_of) instead of:\n" + "\n".join(found)
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


# ------------------------------------------------------------------------------------------ job states
STATE_VALUES = {state.value for state in JobState}


def is_state(node: ast.AST) -> bool:
    """`JobState.RUNNING`, `JobState.RUNNING.value`, or the text of a state: `"running"`."""
    if isinstance(node, ast.Attribute) and node.attr == "value":
        node = node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id == "JobState"
    return isinstance(node, ast.Constant) and node.value in STATE_VALUES


def state_texts(node: ast.AST) -> list[ast.Constant]:
    """The state strings `node` is or holds (a constant, or the items of a list, tuple or set)."""
    items = node.elts if isinstance(node, ast.List | ast.Tuple | ast.Set) else [node]
    return [i for i in items if isinstance(i, ast.Constant) and i.value in STATE_VALUES]


def state_spellings(source: str) -> list[tuple[int, str]]:
    """(line, code) of each place in `source` that spells job states instead of using shared/contracts/jobstate.py:
    a list, tuple or set of two states or more, a filtered pick of JobState's members, or a state's text
    compared with a state or given as `state=`/`states=`."""
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.List | ast.Tuple | ast.Set):
            spelled = sum(map(is_state, node.elts)) >= 2
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            spelled = any(
                g.ifs and isinstance(g.iter, ast.Name) and g.iter.id == "JobState" for g in node.generators
            )
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            spelled = any("state" in ast.unparse(side).lower() for side in sides) and any(
                state_texts(side) for side in sides
            )
        elif isinstance(node, ast.keyword):
            spelled = node.arg in ("state", "states") and bool(state_texts(node.value))
        else:
            continue
        if spelled:
            found.setdefault(node.lineno, ast.unparse(node))  # (the outermost, when nested)
    return sorted(found.items())


def test_no_module_but_jobstate_spells_a_set_of_states():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for path in product_modules(JOBSTATE_MODULE)
        for line, code in state_spellings(path.read_text())
    ]
    assert not found, (
        "use gpuyard.shared.contracts.jobstate (LIVE_STATES, ACTIVE_STATES, TERMINAL_STATES, JobState, state_values) "
        "instead of:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        "LIVE = [s.value for s in JobState if not s.terminal]",
        "LIVE = {s for s in JobState if s not in TERMINAL_STATES}",
        'page = store.list_projections(states=["placed", "running"], limit=500)',
        "HOLDING = [JobState.PLACED.value, JobState.RUNNING.value]",
        "ok = view.state in (JobState.PLACED, JobState.RUNNING)",
        "ok = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})",
        'alive = doc.get("state") == "running"',
        'ended = view.state in ("succeeded", "failed")',
        'count = store.count_by_tenant(states="queued")',
    ],
)
def test_the_state_check_finds_a_spelled_set(source):
    assert [line for line, _ in state_spellings(source)] == [1]


def test_the_state_check_leaves_the_definitions_uses_alone():
    source = "\n".join(
        [
            'ended = stop in ("cancelled", "preempted", "idle")',  # a stop's reason, not a job's state
            'message = "cancelled"',
            "page = store.list_projections(states=state_values(LIVE_STATES), limit=500)",
            "QUEUED = [JobState.QUEUED.value]",
            "waiting = view.state == JobState.QUEUED",
            "parser.add_argument('--state', type=JobState, choices=list(JobState))",
            "everything = [s.value for s in JobState]",
            "STYLE = {JobState.QUEUED: 'yellow', JobState.RUNNING: 'green'}",
        ]
    )
    assert state_spellings(source) == []
    assert state_spellings(JOBSTATE_MODULE.read_text())  # the definition does spell them: it may


# ------------------------------------------------------------------------------------------ alerts
KIND_VALUES = {kind.value for kind in AlertKind}
SEVERITY_VALUES = {severity.value for severity in AlertSeverity}


def test_every_rule_is_named_by_its_alert_kind():
    assert set(KINDS) == set(Rules.model_fields) < KIND_VALUES
    assert all(type(kind) is AlertKind for kind in KINDS)


def severity_texts(items: list[ast.expr | None]) -> set[str]:
    """The severities `items` spell as strings."""
    return {i.value for i in items if isinstance(i, ast.Constant) and i.value in SEVERITY_VALUES}


def held(node: ast.AST) -> list[ast.expr]:
    """The items of a list, tuple or set; else the node itself."""
    return node.elts if isinstance(node, ast.List | ast.Tuple | ast.Set) else [node]


def alert_spellings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each place in `source` that spells an alert kind or severity instead of using
    gpuyard.shared.contracts.events (AlertKind, AlertSeverity): a kind's text, or an alert id that starts with one
    (`node_lost/…`); a severity's text given as `severity=`, compared with a severity, or two severities or
    more in one list, tuple, set or dict ("warning" alone is also a log level)."""
    found: dict[int, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in KIND_VALUES or node.value.partition("/")[0] in KIND_VALUES and "/" in node.value:
                found.setdefault(node.lineno, repr(node.value))
            continue
        if isinstance(node, ast.keyword):
            spelled = node.arg == "severity" and bool(severity_texts(held(node.value)))
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            spelled = any("severity" in ast.unparse(side).lower() for side in sides) and any(
                severity_texts(held(side)) for side in sides
            )
        elif isinstance(node, ast.List | ast.Tuple | ast.Set):
            spelled = len(severity_texts(node.elts)) >= 2
        elif isinstance(node, ast.Dict):
            spelled = len(severity_texts(node.keys)) >= 2
        else:
            continue
        if spelled:
            found.setdefault(node.lineno, ast.unparse(node))  # (the outermost, when nested)
    return sorted(found.items())


def test_no_module_but_events_spells_an_alert_kind_or_severity():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text}"
        for path in product_modules()
        for line, text in alert_spellings(path.read_text())
    ]
    assert not found, (
        "use gpuyard.shared.contracts.events (AlertKind, AlertSeverity) instead of:\n" + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        'KIND = "job_idle"',
        'raised = AlertRaised(alert_id=aid, kind="gpu_memory_over_slice", message=m)',
        'aid = f"node_lost/{node}"',
        'CLEARED = {"gpu_idle": "the GPU is busy again"}',
        'raised = AlertRaised(alert_id=aid, kind=KIND, severity="warning", message=m)',
        'STYLE = {"critical": "bold red", "warning": "yellow", "info": "cyan"}',
        'loud = alert.severity == "critical"',
        'loud = alert.severity in ("warning", "critical")',
    ],
)
def test_the_alert_check_finds_a_spelled_kind_or_severity(source):
    assert [line for line, _ in alert_spellings(source)] == [1]


def test_the_alert_check_leaves_other_strings_alone():
    source = "\n".join(
        [
            'uvicorn.run(app, log_level="warning")',
            'PRIORITY_CLASSES = {"low": 10, "normal": 50, "high": 100, "critical": 1000}',
            'aid = f"{AlertKind.JOB_IDLE}/{job_id}/{attempt}"',
            'doc = "the gpu_idle rule: a job_idle alert (job_idle/<job id>/<attempt>)"',
            "STYLE = {AlertSeverity.CRITICAL: 'bold red', AlertSeverity.WARNING: 'yellow'}",
            "raised = AlertRaised(alert_id=aid, kind=AlertKind.GPU_IDLE, severity=rule.severity, message=m)",
        ]
    )
    assert alert_spellings(source) == []


# ------------------------------------------------------------------------------------------ stops, preemptions, outcomes
STOPS_MODULE = ROOT / "shared" / "contracts" / "stops.py"
STOP_VALUES = (
    {reason.value for reason in StopReason}
    | {cause.value for cause in PreemptionCause}
    | {outcome.value for outcome in AttemptOutcome}
)
STOP_NAMES = re.compile(r"why|stop|cause|reason|outcome|preempt", re.IGNORECASE)
"""Names that hold a stop's reason, a preemption's cause or an attempt's outcome."""
STOPPERS = {
    "stop_attempt",
    "stopping",
    "stop",
    "settle",
    "release",
    "stopped",
    "attempt_end",
    "exit_after_stop",
}
"""The functions that take a stop's reason."""


def stop_texts(node: ast.AST | None) -> set[str]:
    """The stop reasons, preemption causes or outcomes `node` spells as strings (a constant, the items of a
    list, tuple or set, or either side of a conditional)."""
    if isinstance(node, ast.IfExp):
        return stop_texts(node.body) | stop_texts(node.orelse)
    return {i.value for i in held(node) if isinstance(i, ast.Constant) and i.value in STOP_VALUES}


def outcome_text(node: ast.JoinedStr) -> bool:
    """An f-string that writes an attempt's outcome with its reason as text: f"failed: {data.reason}" (not a
    sentence that starts with the word: f"failed: {d.message}")."""
    first, second = (node.values + [None, None])[:2]
    return (
        isinstance(first, ast.Constant)
        and isinstance(first.value, str)
        and first.value.endswith(": ")
        and first.value[:-2] in {o.value for o in AttemptOutcome}
        and isinstance(second, ast.FormattedValue)
        and bool(re.search(r"reason|cause|failure|requeue", ast.unparse(second.value)))
    )


def enum_members(tree: ast.AST) -> set[ast.AST]:
    """The member definitions of the enums `tree` defines (another enum's values may be alike: RequeueReason)."""
    return {
        item
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and any("Enum" in ast.unparse(base) for base in node.bases)
        for item in node.body
    }


def stop_spellings(source: str) -> list[tuple[int, str]]:
    """(line, code) of each place in `source` that spells a stop's reason, a preemption's cause or an attempt's
    outcome instead of using gpuyard.shared.contracts.stops (StopReason, PreemptionCause, AttemptOutcome): such a
    text assigned to, given as or compared with a name that holds one (`why`, `stop`, `cause`, `outcome`…),
    given to a function that stops an attempt, or an outcome written with its reason (`f"failed: {r}"`)."""
    tree = ast.parse(source)
    members = enum_members(tree)
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and node not in members:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            spelled = any(STOP_NAMES.search(ast.unparse(t)) for t in targets) and bool(stop_texts(node.value))
        elif isinstance(node, ast.keyword):
            spelled = (
                node.arg is not None and bool(STOP_NAMES.search(node.arg)) and bool(stop_texts(node.value))
            )
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            spelled = any(STOP_NAMES.search(ast.unparse(side)) for side in sides) and any(
                stop_texts(side) for side in sides
            )
        elif isinstance(node, ast.Call):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            spelled = func in STOPPERS and any(stop_texts(arg) for arg in node.args)
        elif isinstance(node, ast.JoinedStr):
            spelled = outcome_text(node)
        else:
            continue
        if spelled:
            found.setdefault(node.lineno, ast.unparse(node))
    return sorted(found.items())


def test_no_module_but_stops_spells_a_stop_reason_a_preemption_cause_or_an_outcome():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {code}"
        for path in product_modules(STOPS_MODULE)
        for line, code in stop_spellings(path.read_text())
    ]
    assert not found, (
        "use gpuyard.shared.contracts.stops (StopReason, PreemptionCause, AttemptOutcome) instead of:\n"
        + "\n".join(found)
    )


@pytest.mark.parametrize(
    "source",
    [
        'ended = stop in ("cancelled", "preempted", "idle")',
        'await self.stop_attempt(key, "timeout", grace)',
        'record.stopping("idle", grace)',
        'if why == "cancelled" or view.cancel_requested: pass',
        'why = "priority" if lower else "reclaim"',
        'PREEMPTED = "preempted"',
        'DRAIN_REASON = "drain"',
        'data = JobPreempted(job_id=j, attempt=1, cause="drain", node=n)',
        'outcome = f"failed: {data.reason}"',
        'return _ended(at, f"requeued: {data.reason}", code)',
        'if held.stop in ("cancelled", "preempted"): pass',
    ],
)
def test_the_stop_check_finds_a_spelled_reason_cause_or_outcome(source):
    assert [line for line, _ in stop_spellings(source)] == [1]


def test_the_stop_check_leaves_other_strings_and_the_definitions_uses_alone():
    source = "\n".join(
        [
            'message = "cancelled while running"',
            'PRIORITY_CLASSES = {"low": 10, "normal": 50, "high": 100, "critical": 1000}',
            "why = PreemptionCause.PRIORITY if lower else PreemptionCause.RECLAIM",
            "await self.stop_attempt(key, StopReason.TIMEOUT, grace)",
            "if held.stop in ASKED_STOPS: pass",
            'return f"{self.outcome}: {why}"',
            'text = f"requeued as attempt {d.attempt}"',
            'line = f"failed: {d.message}"',
            'class RequeueReason(StrEnum):\n    PREEMPTED = "preempted"',
            'job = platform.wait_state(job_id, {"failed"})',
            'rows.append(("Priority", spec.priority))',
        ]
    )
    assert stop_spellings(source) == []
    assert stop_spellings('why = "drain"') and len(product_modules(STOPS_MODULE)) > 50
