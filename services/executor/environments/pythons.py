"""The Python interpreters a node makes environments from: system ones (`python3.N` in the folders of
GPUYARD_ENVIRONMENT_PYTHONS_PATH) that jobs' unprivileged users can run, found once at the executor's start."""

from __future__ import annotations

import os
import re
from pathlib import Path

from gpuyard.shared.runtime.paths import unreachable_to_others

_NAME = re.compile(r"^python(3\.[0-9]{1,2})$")


def find_pythons(search_path: str) -> dict[str, str]:
    """Version ("3.11") → the interpreter's path, first folder first; an interpreter users other than its owner
    cannot run (one under /root) is left out: a job of another user could not start from it."""
    found: dict[str, str] = {}
    for folder in filter(None, search_path.split(os.pathsep)):
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for name in names:
            match = _NAME.match(name)
            path = Path(folder) / name
            if match is None or match[1] in found or not os.access(path, os.X_OK):
                continue
            try:
                if unreachable_to_others(path) is not None:
                    continue
            except OSError:
                continue
            found[match[1]] = str(path)
    return found


def default_python(pythons: dict[str, str]) -> str | None:
    """The version an environment without `python` gets: the newest the node offers."""
    return max(pythons, key=lambda v: tuple(map(int, v.split(".")))) if pythons else None
