"""The folders a replica of the local backend starts with, made by its first process before it leaves the
platform's user (`folders` of its start: `reaper/folders.py`, replica_start.c), not by the executor, whose
event loop a mkdir would hold for ~70-190 µs of CPU each: its working directory, its attempt's private
temporary folders (`privatetmp.py`), its job's checkpoint and output folders (`jobstorage.py`), and the
platform's folders of its attempt above them. What no start makes twice (the job root, the storage root's
folder of each tenant) the executor makes itself, once.

Each is 0700 and the job's user's (the platform's own where the job runs as it), in folders of the platform's:
0711 (passed through, not listed) where jobs run as other users. One already there is kept when it is its
owner's (an earlier attempt's, another replica's), given to its owner when the platform's (a start that made it
and had not given it yet), refused when it is another user's or not a folder: the start fails and says which
(`refused_words`)."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass

from gpuyard.services.executor.exits import AttemptKey
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.paths import job_workdir

WORKDIR = "its working directory"
STORAGE = "its checkpoint and output folders"
ATTEMPT = "its attempt's folders"


@dataclass(frozen=True, slots=True)
class Folder:
    """One folder a replica's first process makes."""

    path: str
    mode: int
    owner: tuple[int, int] | None
    """The uid and gid it is given; None: the platform's (its maker's)."""
    what: str
    """What it is, in the words of a start that could not make it."""

    def request(self) -> list:
        """As a start asks for it (`[path, mode, uid, gid]`, -1: the platform's)."""
        uid, gid = self.owner or (-1, -1)
        return [self.path, self.mode, uid, gid]


def users_folder(path: str, user: JobUser | None, what: str) -> Folder:
    """A folder of the job's (0700): its user's, or the platform's where the job runs as the platform's user."""
    return Folder(path, 0o700, (user.uid, user.gid) if user else None, what)


def attempt_folders(job_root: str, key: AttemptKey) -> list[Folder]:
    """The platform's folders of an attempt in the job root, `<job root>/<id>/attempt-<n>` (0711), where the
    working directories and private /tmp of replicas that run as other users are."""
    attempt = os.path.dirname(job_workdir(job_root, *key, 0))
    return [Folder(os.path.dirname(attempt), 0o711, None, ATTEMPT), Folder(attempt, 0o711, None, ATTEMPT)]


def unmade(folders: Sequence[Folder]) -> Folder | None:
    """The first of `folders` that is not there as it should be (missing, not a folder, not its owner's)."""
    platform = os.geteuid()
    for folder in folders:
        try:
            found = os.lstat(folder.path)
        except OSError:
            return folder
        owner = folder.owner[0] if folder.owner else platform
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != owner:
            return folder
    return None


def refused_words(folders: Sequence[Folder], code: int | None, message: str) -> str:
    """Why a start could not make its folders (its first process said `code`, `message`), in the words of its
    failure: which folder, never where."""
    which = unmade(folders)
    what = which.what if which else "its folders"
    if code == errno.EEXIST:
        return f"cannot make {what}: one is there that is not its own (another user's, or not a folder)"
    return f"cannot make {what}: {message}"
