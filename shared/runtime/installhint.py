"""The pip command that adds one of GPUYARD's extras (`sim`, `serving`, `s3`…) to the installation that runs:
what a message says to type when an optional package is missing.

GPUYARD is installed from its repository, not from a package registry, so `pip install 'gpuyard[sim]'` works
only where that pip finds gpuyard installed already (it then reads the extra from the installed metadata and
fetches only the extra's packages); elsewhere it looks gpuyard up on the registry and fails. So the command:
- runs this interpreter's pip: the `pip` first on PATH may be another environment's (a venv not activated);
- from a checkout (an editable install, or the source tree on sys.path) names the checkout itself,
  `pip install -e '/path/to/checkout[sim]'`, which works whatever is installed;
- from a wheel says `pip install 'gpuyard[sim]'`, which finds the gpuyard installed beside this code.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shlex
import shutil
import sys
import tomllib
import urllib.parse
import urllib.request
from pathlib import Path

PROJECT = "gpuyard"
SOURCE_ROOT = (
    Path(__file__).resolve().parents[2]
)  # the folder that holds shared/: a checkout, or site-packages


def install_command(*extras: str) -> str:
    """`pip install …` that adds `extras` (none: GPUYARD itself) to the installation this code runs from."""
    wanted = f"[{','.join(extras)}]" if extras else ""
    source = checkout()
    if source is not None:
        return f"{pip_command()} install -e {shlex.quote(f'{source}{wanted}')}"
    return f"{pip_command()} install {shlex.quote(PROJECT + wanted)}"


def checkout() -> Path | None:
    """The GPUYARD checkout this code runs from, or None when it runs from an installed wheel."""
    if is_checkout(SOURCE_ROOT):  # the source tree on sys.path, or an editable install that maps to it
        return SOURCE_ROOT
    return editable_source()


def is_checkout(folder: Path) -> bool:
    try:
        return tomllib.loads((folder / "pyproject.toml").read_text())["project"]["name"] == PROJECT
    except (OSError, ValueError, KeyError, TypeError):
        return False


def editable_source() -> Path | None:
    """The checkout an editable install of gpuyard names in its direct_url.json (PEP 610), when it is one: the
    case where the modules run from a copy (setuptools' strict editable mode links them from build/)."""
    try:
        record = json.loads(importlib.metadata.distribution(PROJECT).read_text("direct_url.json") or "")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return None
    if not isinstance(record, dict) or not (record.get("dir_info") or {}).get("editable"):
        return None
    url = urllib.parse.urlparse(str(record.get("url", "")))
    if url.scheme != "file":
        return None
    folder = Path(urllib.request.url2pathname(url.path))
    return folder if is_checkout(folder) else None


def pip_command() -> str:
    """How to run this interpreter's pip from the user's shell: `pip` when the first pip on PATH is it, else its
    script by its path, else `python -m pip` through the interpreter's path."""
    interpreter = sys.executable
    if not interpreter:  # (an embedded interpreter: nothing better to say)
        return "python3 -m pip"
    script = Path(interpreter).parent / "pip"  # not resolved: a venv's python is a link out of the venv
    if _runs_with(script, interpreter):
        on_path = shutil.which("pip")
        return "pip" if on_path and os.path.samefile(on_path, script) else shlex.quote(str(script))
    return f"{shlex.quote(interpreter)} -m pip"


def _runs_with(script: Path, interpreter: str) -> bool:
    """Whether `script` is a pip launcher of `interpreter` (its #! line names it)."""
    try:
        with script.open("rb") as file:
            first = file.readline(4096).decode(errors="replace")
    except OSError:
        return False
    shebang = first.removeprefix("#!").strip()
    if not first.startswith("#!") or not shebang:
        return False
    try:
        return os.path.samefile(shlex.split(shebang)[0], interpreter)
    except (OSError, ValueError):
        return False
