"""The init container that copies a job's volumes kept in an object store into its pod (`volumecopy.py`):

    python -m gpuyard.services.executor.kubernetes.volumefetch ROOT TENANT NAME...

with the store's URL in GPUYARD_VOLUME_STORE and its credentials in the standard AWS variables. Each volume is
copied by the local backend's own copy (`volumecache.VolumeCache`) into `ROOT/volume-cache/<tenant>/<name>/`,
then opened to every user (0755): the folder is in the pod's own emptyDir, which no other tenant's job sees, and
the job's container may run as another user than this one. Prints what each copy did, one line a volume; a copy
that fails prints the reason on stderr, which the kubelet keeps as the container's termination message, and
exits 1: the pod fails before the job's command runs.
"""

from __future__ import annotations

import asyncio
import os
import sys

from gpuyard.services.executor.kubernetes.volumecopy import STORE_VARIABLE
from gpuyard.services.executor.volumecache import CacheError, VolumeCache
from gpuyard.shared.contracts.jobspec import VolumeMount

USAGE = "usage: python -m gpuyard.services.executor.kubernetes.volumefetch ROOT TENANT NAME..."


def fetch(url: str, root: str, tenant: str, names: list[str]) -> list[str]:
    """The volumes copied into `root`, each opened to every user; the notes of the copies. CacheError."""
    cache = VolumeCache(url, root, lambda _tenant: None)
    wanted = [VolumeMount(name=name, path=name, read_only=True) for name in names]
    cached = asyncio.run(cache.fetch(wanted, tenant))
    for name in names:
        os.chmod(cache.folder(tenant, name), 0o755)
    return list(cached.notes)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    url = os.environ.get(STORE_VARIABLE, "")
    if len(args) < 3:
        print(USAGE, file=sys.stderr)
        return 2
    if not url:
        print(f"{STORE_VARIABLE} is not set: no object store to copy the volumes from", file=sys.stderr)
        return 2
    root, tenant, names = args[0], args[1], args[2:]
    try:
        notes = fetch(url, root, tenant, names)
    except (CacheError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 1
    for note in notes:
        print(note, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
