"""What README.md and docs/*.md tell a user to type, or say the platform serves, is what the code accepts and
serves: every `gpuyard` command in them parses with the CLI's own parser, every API path is a route of the
OpenAPI document, every GPUYARD_* variable is one the code reads, every local address's port is one a
setting or `gpuyard up` gives, and every job spec they show is one the platform accepts."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from gpuyard.cli import build_parser
from gpuyard.docsgen.settings import TABLES
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.scheduling.sim.cli import add_arguments as add_sim_arguments
from gpuyard.shared.settings.names import env_name
from gpuyard.supervisor.options import DEFAULT_NATS_PORT

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
PLACEHOLDER = re.compile(r"^(\{[^}]*\}|<[^>]*>|[A-Z][A-Z0-9_]*|…|\.\.\.)$")
SYNOPSIS = re.compile(r"[\[\]|…<>]")  # `gpuyard up [--data-dir DIR] [--demo]`: a synopsis, not a command


def commands(text: str) -> list[tuple[str, bool]]:
    """The `gpuyard …` command lines of a document, each with whether it is typed out in full (in a code
    block) rather than mentioned inline, where `gpuyard why` or `--executors N` stand for a command."""
    found = []
    lines = [(line, True) for block in FENCE.findall(text) for line in block.splitlines()]
    for raw, typed in lines + [(span, False) for span in INLINE.findall(text)]:
        line = re.sub(r"^\s*(\$ )?", "", raw)
        line = re.sub(r"\s+#.*$", "", line)
        line = re.sub(r"^(\w+=\S+ )+", "", line)  # VAR=value gpuyard …
        line = line.removeprefix(".venv/bin/")
        if line.startswith("gpuyard ") and not SYNOPSIS.search(line):
            found.append((line, typed))
    return found


WRONG_EVEN_INLINE = ("unrecognized arguments", "invalid choice")


def parse(argv: list[str]) -> str | None:
    """The parser's complaint about `argv` (a `gpuyard` command line without `gpuyard`), None if it parses."""
    if argv[:1] == ["sim"]:
        parser = argparse.ArgumentParser(prog="gpuyard sim")
        add_sim_arguments(parser)
        argv = argv[1:]
    else:
        parser = build_parser()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            return None if exc.code == 0 else stderr.getvalue().strip().splitlines()[-1]
    return None


def every(pattern: str) -> list[tuple[str, str]]:
    return [(doc.name, m) for doc in DOCS for m in re.findall(pattern, doc.read_text())]


def test_the_docs_show_commands_to_check():
    assert len([c for doc in DOCS for c in commands(doc.read_text())]) >= 20


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_gpuyard_command_in_the_docs_parses(doc):
    refused = []
    for line, typed in commands(doc.read_text()):
        words = shlex.split(line)[1:]
        complaint = parse(words if typed else [w for w in words if not PLACEHOLDER.match(w)])
        if complaint and (typed or any(w in complaint for w in WRONG_EVEN_INLINE)):
            refused.append(f"{line!r}: {complaint}")
    assert not refused, "\n".join(refused)


def test_a_command_the_cli_does_not_take_is_caught():
    assert parse(["submit", "job.yaml", "--follow"]) is None
    assert "unrecognized arguments: --flollow" in parse(["submit", "job.yaml", "--flollow"])
    assert parse(["sim", "--trace", "x.csv", "--policy", "bestfit"]) is None
    assert commands("run `gpuyard ps --all` or\n```bash\n$ gpuyard logs J -f  # follow\n```\n") == [
        ("gpuyard logs J -f", True),
        ("gpuyard ps --all", False),
    ]


def api_paths() -> list[list[str]]:
    from gpuyard.services.submit.app import create_app

    app = create_app(
        SimpleNamespace(max_body_bytes=1, max_model_bytes=1)
    )  # the document only: no request is served
    return [p.split("/")[1:] for p in app.openapi()["paths"]]


def served(path: str, routes: list[list[str]]) -> bool:
    parts = path.split("?")[0].rstrip("/.,:;").split("/")[1:]
    return any(
        len(route) == len(parts)
        and all(
            r == p or r.startswith("{") or PLACEHOLDER.match(p) for r, p in zip(route, parts, strict=True)
        )
        for route in routes
    )


def test_every_api_path_in_the_docs_is_a_route():
    routes = api_paths()
    assert served("/v1/jobs/JOB_ID/events", routes) and not served("/v1/jobz", routes)
    missing = [f"{doc}: {path}" for doc, path in every(r"(/v1/[\w{}<>/.\-…]*)") if not served(path, routes)]
    assert not missing, "\n".join(missing)


def known_variables() -> set[str]:
    """The settings' variables, and every GPUYARD_* name the product's code spells (a job's environment, …)."""
    names = {env_name(n, t.nested_in) for t in TABLES for n in t.model.model_fields}
    for folder in ("shared", "services", "gpuyard"):
        for source in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(r"GPUYARD_[A-Z0-9_]+", source.read_text()))
    for test_only in (
        "GPUYARD_TEST_MONGODB_URL",
        "GPUYARD_TEST_CHROMIUM",
    ):  # read by the tests, documented for operators running them
        names.add(test_only)
    return names


def test_every_variable_in_the_docs_is_read_by_the_code():
    known = known_variables()
    families = {n for n in known if n.endswith("_") and n != "GPUYARD_"}  # GPUYARD_VOLUME_<NAME>, …
    unknown = {
        f"{doc}: {name}"
        for doc, name in every(r"\b(GPUYARD_[A-Z0-9_]*[A-Z0-9])\b")
        if name not in known and not any(name.startswith(f) for f in families)
    }
    assert not unknown, "\n".join(sorted(unknown))


def test_every_local_port_in_the_docs_is_one_the_platform_listens_on():
    ports = {DEFAULT_NATS_PORT}
    for table in TABLES:
        for name, field in table.model.model_fields.items():
            if name.endswith("port") and isinstance(field.default, int) and field.default:
                ports.add(field.default)
    claimed = every(r"(?:127\.0\.0\.1|localhost|0\.0\.0\.0):(\d{2,5})\b")
    assert claimed
    wrong = [f"{doc}: port {port}" for doc, port in claimed if int(port) not in ports]
    assert not wrong, "\n".join(wrong)


def job_specs(text: str) -> list[dict]:
    """The YAML blocks of a document that are job specs (they have a `command`)."""
    blocks = re.findall(r"^```ya?ml\n(.*?)^```", text, re.M | re.S)
    return [spec for spec in map(yaml.safe_load, blocks) if isinstance(spec, dict) and "command" in spec]


def test_every_job_spec_the_docs_show_is_accepted():
    specs = [(doc.name, spec) for doc in DOCS for spec in job_specs(doc.read_text())]
    assert any(name == "README.md" for name, _ in specs)
    refused = []
    for name, spec in specs:
        try:
            JobSpec.model_validate(spec)
        except ValueError as exc:  # (pydantic's ValidationError is one)
            refused.append(f"{name}: {spec.get('name')}: {exc}")
    assert not refused, "\n".join(refused)
