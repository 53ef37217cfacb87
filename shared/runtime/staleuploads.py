"""Uploads left behind by a writer that is gone (a crash mid-upload): what the next upload of the same folder
removes, once they are older than a day."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path

STALE_UPLOAD = 24 * 3600.0
"""An upload's file or folder left this long is its writer's no more."""


def remove_stale(folder: Path, older_than: float = STALE_UPLOAD) -> None:
    """Remove the entries of `folder` (files and folders, never through a link) not changed for `older_than`
    seconds; what cannot be removed is left."""
    cutoff = time.time() - older_than
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
