"""One import package: the project's code, tests, benchmarks, deployment files and docs name its modules as
`gpuyard.services.*` and `gpuyard.shared.*`, never by the folders' own names (`services.submit`, `shared.events`),
which would import a second copy of them from the working directory, or someone else's package of that name."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.unit.project.test_packaging import ROOT

OLD_NAMES = [
    re.compile(r"^\s*(?:from|import) (?:services|shared)(?:\.| import)", re.M),  # an import
    re.compile(r"-m (?:services|shared)\.\w"),  # a module run as a program
    re.compile(r"""["'`](?:services|shared)\.(?:submit|scheduler|executor|serving|monitor|events|api)\b"""),
]
TEXT_FILES = (".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".cfg")


def tracked_files() -> list[str]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [
        name for name in listed.split() if name.endswith(TEXT_FILES) or name in ("Dockerfile", "Makefile")
    ]


def old_names(text: str) -> list[str]:
    return [match.group(0).strip() for pattern in OLD_NAMES for match in pattern.finditer(text)]


def test_nothing_names_a_module_outside_the_gpuyard_namespace():
    found = {}
    for name in tracked_files():
        path = ROOT / name
        if path == Path(__file__):  # (this file's examples of what the check finds)
            continue
        if path.is_file() and (said := old_names(path.read_text(errors="replace"))):
            found[name] = said
    assert not found, found


def test_the_check_finds_each_old_form():
    text = (
        "from shared.events import Subject\nimport services.submit.app\nfrom shared import why\n"
        "python -m services.submit\nlog = 'services.executor'\n`shared.api.JobOut`\n"
        "from gpuyard.shared.contracts.events import Subject\npython -P -m gpuyard.services.submit\n"
        "shared.labels['job']\n"  # (a variable named shared)
    )
    assert old_names(text) == [
        "from shared.",
        "import services.",
        "from shared import",
        "-m services.s",
        "'services.executor",
        "`shared.api",
    ]
