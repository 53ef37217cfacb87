"""What README.md, CONTRIBUTING.md and docs/*.md point at exists: every relative link and image (and the heading its #anchor
names), every repository path they name (`services/…`, `shared/…`, `deploy/…`, `examples/…`, `benchmarks/…`,
`tests/…`, `gpuyard/…`, `docs/…`, or a `../…` path, which must stay inside the repository), every module they
run (`python -m gpuyard.services.submit`), and every class, function or constant they name with its module: a dotted
name (`gpuyard.shared.contracts.policies.Policy`) or a name beside its file (`services/x.py`'s `Name`, `Name` in `x.py`,
`x.py` (`Name`…), a table row `| x.py | Name |`). Names are looked up in the module's source (its top level, or
a class's body for `Class.member`), without importing it."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("gpuyard", "shared", "services", "benchmarks", "tests")
TOP_FOLDERS = (*PACKAGES, "deploy", "examples", "docs")

FENCE = re.compile(r"^```[^\n]*\n.*?^```[^\n]*$", re.M | re.S)
SPAN = re.compile(r"`[^`\n]+`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""<(?:a|img)\b[^>]*?\b(?:href|src)=["']([^"']+)["']""")
SCHEME = re.compile(r"^[A-Za-z][\w+.-]*:")
REPO_PATH = re.compile(r"(?<![\w./~$-])((?:{})/[\w./*-]*)".format("|".join(TOP_FOLDERS)))
CLIMBING_PATH = re.compile(r"(?<![\w./~$-])((?:\.\./)+[\w./*-]+)")
PLACEHOLDER = re.compile(r"\.\.\.|…|<|\{")
DOTTED = re.compile(r"`((?:{})(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`".format("|".join(PACKAGES)))
RUN_MODULE = re.compile(r"-m ((?:{})(?:\.\w+)*)".format("|".join(PACKAGES)))
PY = r"`([\w./-]+\.py)`"
NAME = r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\([^`]*\))?`"
GAP = r"(?:[ \t]+\n?[ \t]*|\n[ \t]*)"  # spaces, at most one line break: within a paragraph
BESIDE = [  # a name written beside its file, path first (1) or name first (2)
    (re.compile(PY + r"'s" + GAP + NAME), 1),
    (re.compile(PY + r":?" + GAP + r"\(?" + NAME), 1),
    (re.compile(r"\|[ \t]*" + PY + r"[ \t]*\|[ \t]*" + NAME), 1),
    (re.compile(NAME + GAP + r"(?:in|of|from)" + GAP + PY), 2),
    (re.compile(NAME + GAP + r"\(" + PY), 2),
]


def prose(text: str) -> str:
    """The text without its fenced code blocks, which hold commands and output rather than links."""
    return FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text without markup, lowercased, punctuation dropped, spaces → '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*_~]|<[^>]+>", lambda m: "_" if m.group(0) == "_" else "", text)
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


@functools.cache
def anchors(text: str) -> frozenset[str]:
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose(text), re.M):
        base, n = slug(heading), 0
        while (name := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(name)
    found |= set(re.findall(r"""<a\s+(?:id|name)=["']([^"']+)["']""", text))
    return frozenset(found)


def inside(path: Path) -> bool:
    return path.resolve().is_relative_to(ROOT)


def exists(path: Path) -> bool:
    if "*" in path.name or "*" in str(path.parent):
        return inside(path.parent) and any(ROOT.glob(str(path.resolve().relative_to(ROOT))))
    return inside(path) and path.exists()


def broken_links(doc: Path, text: str) -> list[str]:
    links = SPAN.sub("", prose(text))  # a link written inside backticks is code, not a link
    broken = []
    for target in LINK.findall(links) + HTML_LINK.findall(links):
        if SCHEME.match(target):
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve()
        if not path:
            if anchor not in anchors(text):
                broken.append(f"{target}: {doc.name} has no heading {target}")
        elif not inside(file):
            broken.append(f"{target}: outside the repository")
        elif not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            broken.append(f"{target}: {file.name} has no heading #{anchor}")
    return broken


def missing_paths(doc: Path, text: str) -> list[str]:
    missing = []
    for number, line in enumerate(text.splitlines(), 1):
        for raw in REPO_PATH.findall(line):
            path = raw.rstrip(".,:;")
            if not PLACEHOLDER.search(line[line.find(raw) + len(raw) :][:1]) and not exists(ROOT / path):
                missing.append(f"line {number}: {path}")
        for raw in CLIMBING_PATH.findall(line):
            path = raw.rstrip(".,:;")
            if not exists(doc.parent / path):
                where = "outside the repository" if not inside(doc.parent / path) else "no such file"
                missing.append(f"line {number}: {path} ({where})")
    return missing


@functools.cache
def python_files() -> tuple[str, ...]:
    return tuple(
        p.relative_to(ROOT).as_posix()
        for folder in PACKAGES
        for p in (ROOT / folder).rglob("*.py")
        if "__pycache__" not in p.parts
    )


MAPPED = {"gpuyard.services": "services", "gpuyard.shared": "shared"}  # (setup.py's folders in the namespace)


def module_file(dotted: str) -> Path | None:
    for name, folder in MAPPED.items():
        if dotted == name or dotted.startswith(f"{name}."):
            dotted = folder + dotted[len(name) :]
    base = ROOT.joinpath(*dotted.split("."))
    for file in (base.with_suffix(".py"), base / "__init__.py"):
        if file.is_file():
            return file
    return None


@functools.cache
def top_level(file: Path) -> dict[str, ast.AST]:
    """The names a module defines or imports at its top level (under `if`/`try` too), each with its node."""
    names: dict[str, ast.AST] = {}

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names[node.name] = node
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for leaf in ast.walk(target):
                        if isinstance(leaf, ast.Name):
                            names[leaf.id] = node
            elif isinstance(node, ast.Import | ast.ImportFrom):
                for alias in node.names:
                    names[(alias.asname or alias.name).split(".")[0]] = node
            elif isinstance(node, ast.If | ast.Try | ast.With):
                visit(node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(ast.parse(file.read_text()).body)
    return names


def defines(file: Path, name: str) -> bool:
    """Whether `file` defines `name` (`Name`, or `Class.member` in the class's body, fields included)."""
    first, *rest = name.split(".")
    node = top_level(file).get(first)
    if node is None:
        return False
    if not rest or not isinstance(node, ast.ClassDef):
        return True  # (an imported or assigned object's attributes are not looked into)
    members = set()
    for statement in node.body:
        if isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            members.add(statement.name)
        elif isinstance(statement, ast.Assign | ast.AnnAssign):
            targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
            members |= {
                leaf.id for target in targets for leaf in ast.walk(target) if isinstance(leaf, ast.Name)
            }
    return rest[0] in members


def dotted_name_problem(dotted: str) -> str | None:
    """Why `package.module.Name[.member]` does not exist, or None: the longest prefix that is a module, then
    the rest defined in it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        file = module_file(".".join(parts[:cut]))
        if file is None:
            continue
        rest = ".".join(parts[cut:])
        if not rest or defines(file, rest):
            return None
        if cut < len(parts) and module_file(".".join(parts[: cut + 1])) is None:
            return f"{file.relative_to(ROOT)} defines no {rest}"
    return "no such module"


def files_named(path: str) -> list[Path]:
    """The repository's Python file at `path`, or, for a partial path (`scheduling/cluster.py`), every file whose
    path ends with it."""
    if path.startswith(tuple(f"{folder}/" for folder in TOP_FOLDERS)):
        return [ROOT / path] if (ROOT / path).is_file() else []
    return [ROOT / f for f in python_files() if f.endswith(f"/{path}")]


def missing_names(text: str) -> list[str]:
    everything, text = text, prose(text)
    missing = []
    for dotted in DOTTED.findall(text):
        if (problem := dotted_name_problem(dotted)) is not None:
            missing.append(f"`{dotted}`: {problem}")
    for module in RUN_MODULE.findall(everything):
        if module_file(module) is None:
            missing.append(f"python -m {module}: no such module")
    for pattern, path_group in BESIDE:
        for match in pattern.finditer(text):
            path, name = match.group(path_group), match.group(3 - path_group)
            files = files_named(path)
            if not files:
                missing.append(f"`{path}`: no such file (named with `{name}`)")
            elif not any(defines(file, name) for file in files):
                missing.append(
                    f"`{name}`: not defined in {', '.join(str(f.relative_to(ROOT)) for f in files)}"
                )
    return missing


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_relative_link_and_image_leads_to_a_file_and_heading_that_exist(doc):
    broken = broken_links(doc, doc.read_text())
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_repository_path_named_exists(doc):
    missing = missing_paths(doc, doc.read_text())
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize("doc", DOCS, ids=lambda d: d.name)
def test_every_module_class_and_function_named_with_its_module_exists(doc):
    missing = missing_names(doc.read_text())
    assert not missing, "\n".join(missing)


def test_the_checks_find_what_is_gone():
    """Each check on a page made of mistakes the docs once had, beside forms that are right."""
    page = ROOT / "docs" / "page.md"  # (a page that would sit beside the others)
    text = (
        "# A page\n\n## Reason codes (`shared/contracts/reasons.py`)\n\n"
        "[ok](#reason-codes-sharedcontractsreasonspy) [gone](#no-such-heading) ![img](images/none.png)\n"
        "[out](../../elsewhere/notes.md) [web](https://example.com/x) `[code](not/a/link.md)` "
        "[there](scheduler.md#reason-codes-sharedcontractsreasonspy) [not there](scheduler.md#nope)\n"
        "kept in a `Scheduler` (`shared/scheduling/scheduler.py`); `gpuyard.shared.contracts.policies.Policy`, "
        "`gpuyard.shared.contracts.policies.NoSuchPolicy`, `gpuyard.client.Client.submit`, `gpuyard.client.Client.nope`\n"
        "the rule's source: `../../shared/design/monitor-anchors.md`; `HeldCluster` in `scheduling/cluster.py`, "
        "`scheduling/cluster.py`'s `Held`, `shared/scheduling/sim/cli.py`'s `add_arguments`\n"
        "| `batching.py` | `Batcher`: … | and `deploy/kubernetes/overlays/<name>`, `tests/unit/project/test_docs_*.py`\n"
        "```\npython -m gpuyard.services.nope  # [not](a-link.md)\n```\n"
    )
    assert broken_links(page, text) == [
        "#no-such-heading: page.md has no heading #no-such-heading",
        "images/none.png: no such file",
        "../../elsewhere/notes.md: outside the repository",
        "scheduler.md#nope: scheduler.md has no heading #nope",
    ]
    assert missing_paths(page, text) == [
        "line 6: ../../elsewhere/notes.md (outside the repository)",
        "line 7: shared/scheduling/scheduler.py",
        "line 8: ../../shared/design/monitor-anchors.md (outside the repository)",
    ]
    assert missing_names(text) == [
        "`gpuyard.shared.contracts.policies.NoSuchPolicy`: shared/contracts/policies.py defines no NoSuchPolicy",
        "`gpuyard.client.Client.nope`: gpuyard/client.py defines no Client.nope",
        "python -m gpuyard.services.nope: no such module",
        "`Held`: not defined in shared/scheduling/cluster.py",
        "`shared/scheduling/scheduler.py`: no such file (named with `Scheduler`)",
    ]
