"""Tiny wheels made on the spot (a module of one line, its metadata and RECORD), for building job environments
with uv offline (`--offline --no-index --find-links DIR`): no test reaches a package index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path


def make_wheel(folder: Path, name: str, version: str = "1.0", body: str = "") -> Path:
    """`<folder>/<name>-<version>-py3-none-any.whl`, whose module `name` holds `body` (default: VALUE = name)."""
    folder.mkdir(parents=True, exist_ok=True)
    module = name.replace("-", "_")
    dist = f"{module}-{version}.dist-info"
    files = {
        f"{module}.py": body or f"VALUE = {name!r}\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    wheel = folder / f"{module}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def offline_settings(wheels: Path) -> dict[str, str]:
    """The GPUYARD_ENVIRONMENT_* variables of a build from `wheels` only."""
    return {"GPUYARD_ENVIRONMENT_FIND_LINKS": str(wheels), "GPUYARD_ENVIRONMENT_OFFLINE": "true"}
