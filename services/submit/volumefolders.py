"""Volumes in folders of the storage root (`volume_dir`: `<root>/volumes/<tenant>/<name>/`), the default store
(`volumefiles.py`): made, measured, written by uploads and removed here; read through `SafeFolder`.

A volume's folder and everything uploaded into it belong to the user its tenant's jobs run as (the platform's
own where it is not root), 0700 at its top: the tenant's jobs write where they should, another tenant's cannot
even look in. The tenant folders above are the platform's, 0711: every user passes through, none lists them.

An upload is all or nothing: its bytes are written to a file of the platform's beside the tenant's volumes
(`<root>/volumes/<tenant>/.uploads/`, never in the volume: a job does not see a half-written file), counted
against the room the volume has left as they come (past it: `OverQuota`, and the file is removed), fsynced, then
given to the tenant's user and renamed into place. A tree comes as a tar stream: staged whole, checked (only
files and folders; every name a clean path), unpacked into a folder beside it, then moved into place."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tarfile
import uuid
from pathlib import Path

from gpuyard.services.submit.volumefiles import (
    Staged,
    VolumeFiles,
    Written,
    check_name_lengths,
    checked_members,
)
from gpuyard.shared.runtime.paths import VOLUMES, volume_dir
from gpuyard.shared.runtime.safefolder import NotThere, SafeFolder
from gpuyard.shared.runtime.staleuploads import remove_stale
from gpuyard.shared.runtime.tarstream import PathRefused
from gpuyard.shared.runtime.uploadfile import UploadFile

UPLOADS = ".uploads"


class FolderUpload(UploadFile):
    """An upload staged in a file of `<root>/volumes/<tenant>/.uploads/`."""

    def finish(self) -> None:
        self.close()


class FolderVolumes(VolumeFiles):
    """The folders of volumes under `root`."""

    def folder(self, tenant: str, name: str) -> SafeFolder:
        user = self.owner_of(tenant)
        return SafeFolder(volume_dir(self.root, tenant, name), user.uid if user else None)

    def _ids(self, tenant: str) -> tuple[int, int]:
        user = self.owner_of(tenant)
        return (user.uid, user.gid) if user else (os.geteuid(), os.getegid())

    def _tenant_dir(self, tenant: str) -> Path:
        """`<root>/volumes/<tenant>`, the platform's, 0711 (made with its parents when missing)."""
        folder = self.root / VOLUMES / tenant
        for step in (self.root, self.root / VOLUMES, folder):
            with contextlib.suppress(FileExistsError):
                os.mkdir(step, 0o711)
                os.chmod(step, 0o711)  # (whatever the umask)
        return folder

    def make(self, tenant: str, name: str) -> None:
        """The volume's empty folder, 0700 and its tenant's user's; one left by an earlier volume of the name is
        emptied first."""
        self._tenant_dir(tenant)
        path = volume_dir(self.root, tenant, name)
        if os.path.lexists(path):
            self.remove(tenant, name)
        os.mkdir(path, 0o700)
        os.chown(path, *self._ids(tenant))
        os.chmod(path, 0o700)

    def remove(self, tenant: str, name: str) -> None:
        """The volume's folder and everything in it (moved aside first, so that it is gone at once)."""
        path = volume_dir(self.root, tenant, name)
        if not os.path.lexists(path):
            return
        aside = self._tenant_dir(tenant) / UPLOADS / f"deleted-{name}-{uuid.uuid4().hex}"
        aside.parent.mkdir(mode=0o700, exist_ok=True)
        os.rename(path, aside)
        shutil.rmtree(aside, ignore_errors=True)

    def usage(self, tenant: str, name: str) -> tuple[int, int]:
        """(files, bytes) the volume holds now, whoever wrote them."""
        return self.folder(tenant, name).usage()

    def remove_path(self, tenant: str, name: str, path: str) -> tuple[int, int]:
        """Remove the file or folder at `path` (clean, not '') from the volume, a folder moved aside first so
        that it is gone at once: (files, bytes) it held. NotThere for nothing there."""
        folder = self.folder(tenant, name)
        parent, _, leaf = path.rpartition("/")
        dfd = folder.open_dir(parent)
        try:
            try:
                st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                raise NotThere(f"no file or folder {path!r}") from None
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(leaf, dir_fd=dfd)
                return (1, st.st_size) if stat.S_ISREG(st.st_mode) else (0, 0)
            counted = folder.usage_of(path)
            aside = self._tenant_dir(tenant) / UPLOADS / f"deleted-{uuid.uuid4().hex}"
            aside.parent.mkdir(mode=0o700, exist_ok=True)
            os.rename(leaf, aside, src_dir_fd=dfd)
        finally:
            os.close(dfd)
        shutil.rmtree(aside, ignore_errors=True)
        return counted

    # ---------------------------------------------------------------- reading

    # ---------------------------------------------------------------- uploads

    def staging(self, tenant: str, room: int, file_at: tuple[str, str] | None = None) -> FolderUpload:
        uploads = self._tenant_dir(tenant) / UPLOADS
        uploads.mkdir(mode=0o700, exist_ok=True)
        remove_stale(uploads)
        return FolderUpload(uploads, room)

    def place_file(self, tenant: str, name: str, staged: Staged, path: str) -> Written:
        """Move a staged file into the volume at `path` (clean, not ''), replacing a file there. PathRefused
        for a folder in the way, or a link on the way."""
        assert isinstance(staged, FolderUpload)
        if not path:
            raise PathRefused("name the file to write: a path inside the volume")
        folder = self.folder(tenant, name)
        parent, _, leaf = path.rpartition("/")
        check_name_lengths(path)
        uid, gid = self._ids(tenant)
        dfd = folder.open_dir(parent, create=(uid, gid))
        try:
            if folder.kind_of(path) not in (None, "file"):
                raise PathRefused(f"{path!r} is a folder (or a link): not replaced by a file")
            os.chown(staged.path, uid, gid)
            os.chmod(staged.path, 0o644)
            os.replace(staged.path, leaf, dst_dir_fd=dfd)
        finally:
            os.close(dfd)
        return Written(path, 1, staged.size)

    def place_tree(self, tenant: str, name: str, staged: Staged, path: str, room: int) -> Written:
        """Unpack a staged tar stream into the volume under `path` (clean; '' its top): PathRefused for an entry
        that is not a file or a folder or whose name is not a clean path, OverQuota for one whose files take more
        than `room`, and nothing is placed then."""
        assert isinstance(staged, FolderUpload)
        unpacked = staged.path.with_suffix(".d")
        try:
            files, size = _unpack(staged.path, unpacked, room, self._ids(tenant))
            self._merge(self.folder(tenant, name), unpacked, path, self._ids(tenant))
        finally:
            shutil.rmtree(unpacked, ignore_errors=True)
        return Written(path, files, size)

    def _merge(self, folder: SafeFolder, source: Path, path: str, ids: tuple[int, int]) -> None:
        """Rename what `source` holds into the volume's `path`: a folder not there whole, the rest one by one."""
        dfd = folder.open_dir(path, create=ids)
        try:
            for entry in os.scandir(source):
                target = f"{path}/{entry.name}" if path else entry.name
                there = folder.kind_of(target)
                if entry.is_dir(follow_symlinks=False) and there == "dir":
                    self._merge(folder, Path(entry.path), target, ids)
                elif there in (None, "file") and (there is None or not entry.is_dir(follow_symlinks=False)):
                    os.replace(entry.path, entry.name, dst_dir_fd=dfd)
                else:
                    raise PathRefused(f"{target!r} is a {there} in the volume: not replaced by the upload's")
        finally:
            os.close(dfd)


def _unpack(archive: Path, into: Path, room: int, ids: tuple[int, int]) -> tuple[int, int]:
    """Unpack `archive` into the new folder `into`, every entry checked first: (files, bytes)."""
    try:
        with tarfile.open(archive, mode="r:*") as tar:
            members = checked_members(tar, room)
            os.mkdir(into, 0o700)
            for m in members:
                target = into / m.name
                if m.isdir():
                    target.mkdir(mode=0o755, parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
                    src = tar.extractfile(m)
                    assert src is not None  # (a regular file's)
                    with src, open(target, "xb") as out:
                        shutil.copyfileobj(src, out, 1 << 20)
        os.sync()  # (once for the tree: a sync of each of 10,000 small files would take longer than their bytes)
    except tarfile.TarError as exc:
        raise PathRefused(f"not a tar stream: {exc}") from None
    except (FileExistsError, NotADirectoryError) as exc:
        raise PathRefused(
            f"the tree's entries conflict: {exc.filename} is both a file and a folder"
        ) from None
    for folder, dirs, files in os.walk(into):
        for entry in (*dirs, *files):
            os.chown(os.path.join(folder, entry), *ids, follow_symlinks=False)
    os.chown(into, *ids)
    regular = [m for m in members if m.isfile()]
    return len(regular), sum(m.size for m in regular)
