"""The dashboard's scripts take the job states and the event subjects from their one definition: static/
contracts.js is what `python -m gpuyard.docsgen.jscontracts` writes from gpuyard.shared.contracts.jobstate and
gpuyard.shared.contracts.events (made anew by `make docs`), the dashboard serves it as a script, and no other script spells
a state, a subject or a wildcard as a literal of its own (in a comment or inside a longer text it may stand)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gpuyard.docsgen import jscontracts
from gpuyard.services.submit.app import create_app
from gpuyard.shared.contracts.events.subjects import Subject, Wildcard
from gpuyard.shared.contracts.jobstate import (
    ACTIVE_STATES,
    LIVE_STATES,
    TERMINAL_STATES,
    JobState,
    state_values,
)
from tests.unit.project.test_packaging import ROOT
from tests.unit.services.submit.submitctx import submit_context

STATIC = ROOT / "services" / "submit" / "dashboard" / "static"
KEYWORDS_BEFORE_REGEX = {
    "return",
    "typeof",
    "case",
    "of",
    "in",
    "else",
    "void",
    "delete",
    "new",
    "do",
    "yield",
    "await",
}
"""Words after which a `/` starts a regular expression, not a division."""


def string_literals(source: str) -> list[tuple[int, str]]:
    """(line, value) of every whole string literal of JavaScript `source`: "…", '…' and `…` without `${}`
    (its parts inside a substitution are read as code). Comments and regular expressions are skipped; escapes
    are kept as written (a literal with one never equals a state or a subject)."""
    found: list[tuple[int, str]] = []
    end = _scan(source, 0, found, in_substitution=False)
    assert end == len(source), f"unbalanced braces at {end}"
    return found


def _scan(src: str, i: int, found: list[tuple[int, str]], *, in_substitution: bool) -> int:
    """Read code from `i` to the end (or to the `}` that closes a template's substitution); returns where."""
    depth = 0
    prev = ""  # the last significant token: a punctuator's character or a word
    while i < len(src):
        c = src[i]
        if c.isspace():
            i += 1
        elif src.startswith("//", i):
            i = _until(src, "\n", i)
        elif src.startswith("/*", i):
            i = src.index("*/", i + 2) + 2
        elif c in "\"'":
            start, i = i, i + 1
            while src[i] != c:
                assert src[i] != "\n", f"an unterminated string at line {_line(src, start)}"
                i += 2 if src[i] == "\\" else 1
            found.append((_line(src, start), src[start + 1 : i]))
            i += 1
            prev = "literal"
        elif c == "`":
            i = _template(src, i, found)
            prev = "literal"
        elif c == "/":
            if prev and (prev[-1].isalnum() or prev[-1] in "_$)]") and prev not in KEYWORDS_BEFORE_REGEX:
                i += 1  # a division
                prev = "/"
            else:
                i = _regex(src, i)
                prev = "literal"
        elif c.isalnum() or c in "_$":
            start = i
            while i < len(src) and (src[i].isalnum() or src[i] in "_$"):
                i += 1
            prev = src[start:i]
        else:
            if c == "{":
                depth += 1
            elif c == "}":
                if in_substitution and depth == 0:
                    return i
                depth -= 1
            i += 1
            prev = c
    return i


def _template(src: str, i: int, found: list[tuple[int, str]]) -> int:
    start, i, whole = i, i + 1, True
    while src[i] != "`":
        if src[i] == "\\":
            i += 2
        elif src.startswith("${", i):
            whole = False
            i = _scan(src, i + 2, found, in_substitution=True) + 1
        else:
            i += 1
    if whole:
        found.append((_line(src, start), src[start + 1 : i]))
    return i + 1


def _regex(src: str, i: int) -> int:
    i += 1
    in_class = False
    while src[i] != "/" or in_class:
        assert src[i] != "\n", f"an unterminated regular expression at line {_line(src, i)}"
        if src[i] == "\\":
            i += 1
        elif src[i] == "[":
            in_class = True
        elif src[i] == "]":
            in_class = False
        i += 1
    i += 1
    while i < len(src) and src[i].isalpha():  # flags
        i += 1
    return i


def _until(src: str, text: str, i: int) -> int:
    at = src.find(text, i)
    return len(src) if at < 0 else at


def _line(src: str, i: int) -> int:
    return src.count("\n", 0, i) + 1


def spelled(source: str) -> list[tuple[int, str]]:
    """(line, value) of the literals of `source` that spell a state, a subject or a wildcard."""
    words = {*(s.value for s in JobState), *(s.value for s in Subject), *jscontracts.wildcards().values()}
    return [(line, value) for line, value in string_literals(source) if value in words]


def scripts() -> list:
    """The dashboard's scripts but the generated contracts.js."""
    found = sorted([STATIC / "app.js", *(STATIC / "pages").glob("*.js")])
    assert len(found) > 5, found
    return found


# ---------------------------------------------------------------- the generated module


def test_contracts_js_is_the_generators():
    assert (STATIC / "contracts.js").read_text() == jscontracts.render(), (
        "static/contracts.js is stale: make docs (python -m gpuyard.docsgen.jscontracts)"
    )


def test_contracts_js_says_it_is_generated_and_holds_every_state_and_subject():
    text = jscontracts.render()
    assert text.splitlines()[0].startswith("// Generated by `python -m gpuyard.docsgen.jscontracts`")
    states = [s.value for s in JobState]
    assert f"export const STATES = Object.freeze({_js_list(states)});" in text
    for name, states in (("LIVE", LIVE_STATES), ("ACTIVE", ACTIVE_STATES), ("TERMINAL", TERMINAL_STATES)):
        assert f"export const {name}_STATES = Object.freeze({_js_list(state_values(states))});" in text
    for state in JobState:
        assert f'  {state.name}: "{state.value}",\n' in text
    for subject in Subject:
        assert f'  {subject.name}: "{subject.value}",\n' in text
    for wildcard in Wildcard:
        assert f'  {wildcard.name}: "{wildcard.value}",\n' in text
    assert '  NODE: "node.>",\n' in text  # a family of subjects Wildcard lacks (the pages follow node events)
    assert text.count("Object.freeze(") == 7


def _js_list(values: list[str]) -> str:
    return "[" + ", ".join(f'"{v}"' for v in values) + "]"


def test_the_generator_writes_the_file(tmp_path):
    target = tmp_path / "contracts.js"
    assert jscontracts.main(target) == 0
    assert target.read_text() == jscontracts.render()
    assert jscontracts.main(tmp_path / "missing" / "contracts.js") == 1


def test_the_dashboard_serves_the_contracts_as_a_script(tmp_path):
    tokens = {"tok-vision": {"tenant": "vision", "user": "ana"}}
    with (
        submit_context(tmp_path, tokens, session_secret=b"s" * 48, session_lifetime=3600) as ctx,
        TestClient(create_app(ctx)) as client,
    ):
        for path in ("contracts.js", "app.js", "pages/jobs.js"):
            answer = client.get(f"/static/dashboard/{path}")
            assert answer.status_code == 200, path
            assert answer.headers["content-type"].startswith("text/javascript"), answer.headers
        assert answer.text.count('from "../contracts.js"') == 1


# ---------------------------------------------------------------- no script spells them again


SAMPLE = r"""
// a comment may say "queued" and job.placed
/* or "job.>" in a block */
const a = "running";
const b = 'job.placed';
const c = `node.>`;
const d = `state ${"failed"} and ${x ? `job.started` : "waiting for the scheduler"}`;
const e = "the job is queued";
const f = x.split(/`([^`\n]+)`/).map((p) => p);
const g = /"queued"/.test(y) ? 1 / 2 : `gpu.sample`;
const h = { state: "cancelled" };
"""


def test_the_scan_finds_a_spelled_state_or_subject():
    found = spelled(SAMPLE)
    assert found == [
        (4, "running"),
        (5, "job.placed"),
        (6, "node.>"),
        (7, "failed"),
        (7, "job.started"),
        (10, "gpu.sample"),
        (11, "cancelled"),
    ], found
    assert (7, "waiting for the scheduler") in string_literals(SAMPLE)
    assert (8, "the job is queued") in string_literals(SAMPLE)


@pytest.mark.parametrize("script", scripts(), ids=lambda p: p.relative_to(STATIC).as_posix())
def test_no_script_spells_a_state_or_a_subject(script):
    source = script.read_text()
    literals = string_literals(source)
    assert literals, "the scan read no literal at all"
    found = spelled(source)
    assert not found, (
        f"{script.relative_to(ROOT)} spells {found} (line, literal): import STATE, SUBJECT, WILDCARD or a state "
        "set from contracts.js instead"
    )
