"""The start helper (`replica_start.c`): a shared library whose function starts a replica's first process
with vfork and takes its last steps in C (its mount namespace among them, `gpuyard_start_private`), so that
the reaper neither forks itself nor runs Python in the child (reaper/child.py).

It is built from its source with the node's C compiler (`$CC`, else `cc` or `gcc`) at the executor's start,
once per data directory and version of the source: its name carries the source's hash, so that a reaper
started before an upgrade never loads another version's; the build of a new version removes the older ones
(a reaper loaded its own at its start). A helper built beforehand in `bin/` beside this file is taken first
(the image has no compiler: the Dockerfile builds it in a stage of its own, `python start_helper.py DIR`,
which is why this file imports only the standard library). Without a compiler, or where the build fails,
there is no helper and the reaper forks, as before: slower, the same in every other way.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("replica_start.c")
PREBUILT = Path(__file__).with_name("bin")
BUILD_SECONDS = 120
NAME = "gpuyard-replica-start"


def helper_name(source: bytes) -> str:
    return f"{NAME}-{hashlib.sha256(source).hexdigest()[:16]}.so"


def compiler() -> list[str] | None:
    if cc := os.environ.get("CC", "").strip():
        return shlex.split(cc)
    found = shutil.which("cc") or shutil.which("gcc")
    return [found] if found else None


def remove_older(folder: Path, keep: str) -> None:
    """The helpers of earlier versions of the source (a reaper that outlived an upgrade loaded its own at its
    start: what it mapped stays with it)."""
    for old in folder.glob(f"{NAME}-*"):
        if old.name != keep:
            old.unlink(missing_ok=True)


def start_helper(folder: Path) -> str | None:
    """The helper's path under `folder` (a private folder of the platform's), built if it is not there yet;
    None where it cannot be built (the reason is logged)."""
    name = helper_name(SOURCE.read_bytes())
    for built in (PREBUILT / name, folder / name):
        if os.access(built, os.X_OK):
            return str(built)
    target = folder / name
    cc = compiler()
    if cc is None:
        log.warning(
            "no C compiler (cc): replicas are started by a fork of the reaper, ~1.4 ms more CPU per start"
        )
        return None
    os.makedirs(folder, 0o700, exist_ok=True)
    temporary = folder / f".{target.name}.{os.getpid()}"
    command = [*cc, "-O2", "-shared", "-fPIC", "-o", str(temporary), str(SOURCE)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_SECONDS)
        if result.returncode == 0:
            os.chmod(temporary, 0o700)  # (the platform's own, as every file of its data directory)
            os.replace(temporary, target)  # (another executor building it at once: the same file)
            remove_older(folder, keep=target.name)
            return str(target)
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot build the start helper: %s; replicas are started by a fork of the reaper", exc)
        return None
    finally:
        temporary.unlink(missing_ok=True)
    log.warning(
        "cannot build the start helper (%s): %s; replicas are started by a fork of the reaper",
        shlex.join(result.args),
        result.stderr.strip()[-500:],
    )
    return None


if __name__ == "__main__":  # python start_helper.py DIR: build it into DIR (the Dockerfile)
    logging.basicConfig()
    built = start_helper(Path(sys.argv[1]))
    print(built or "", end="")
    sys.exit(0 if built else 1)
