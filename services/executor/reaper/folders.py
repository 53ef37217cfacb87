"""The folders a replica's first process makes before it leaves root (`folders` of a start, step "folders"):
its working directory, its job's checkpoint and output folders, its private temporary folders and the
platform's folders above them (`services/executor/replicafolders.py` plans them), so that the executor's
event loop makes none. As replica_start.c's `make_folders`. Standard library only (see `__init__.py`)."""

from __future__ import annotations

import errno
import os
import stat


def make_folders(folders: list[list]) -> None:
    """Each `[path, mode, uid, gid]` in order: made with `mode` (whatever the umask) and given to uid:gid (-1:
    left its maker's, the platform's). One already there is kept as it is when it is a folder, not a link, of
    its owner-to-be (an earlier attempt's, another replica's); one the platform owns is given to its owner-to-be
    (a start of the same job on another node of a shared storage root, between its mkdir and its chown);
    anything else is refused: OSError EEXIST, never taken over. No link is followed: every place is in a folder
    of the platform's that no job can write in."""
    platform = os.geteuid()
    for path, mode, uid, gid in folders:
        try:
            os.mkdir(path, mode)
        except FileExistsError:
            found = os.lstat(path)
            owner = platform if uid < 0 else uid
            if not stat.S_ISDIR(found.st_mode) or found.st_uid not in (owner, platform):
                raise OSError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None
            if found.st_uid == owner:
                continue
        if uid >= 0:
            os.chown(path, uid, gid, follow_symlinks=False)
        os.chmod(path, mode)
