"""A volume's folder: made for its tenant's user, uploads placed whole or not at all (a file past the room left,
a tree with a link or a `..` in it leave nothing behind), files removed, the folder deleted."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from gpuyard.services.submit.volumefolders import UPLOADS, FolderVolumes
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.paths import VOLUMES
from gpuyard.shared.runtime.tarstream import PathRefused
from gpuyard.shared.runtime.uploadfile import OverQuota

ROOT = os.geteuid() == 0


@pytest.fixture
def files(tmp_path):
    user = JobUser(4243, 4243, "tenant-4243") if ROOT else None
    volumes = FolderVolumes(tmp_path, lambda tenant: user)
    volumes.make("vision", "data")
    return volumes


def _upload(files: FolderVolumes, data: bytes, room: int = 1 << 20):
    staging = files.staging("vision", room)
    try:
        staging.write(data)
        staging.finish()
    except BaseException:
        staging.discard()
        raise
    return staging


def _tree(files: FolderVolumes, data: bytes, path: str = "", room: int = 1 << 20):
    """A tree placed as the route places it: its staged tar removed whatever happens."""
    staging = _upload(files, data)
    try:
        return files.place_tree("vision", "data", staging, path, room)
    finally:
        staging.discard()


def _leftovers(files: FolderVolumes) -> list[str]:
    return os.listdir(files.root / VOLUMES / "vision" / UPLOADS)


def test_the_folder_is_its_tenants_users_and_closed_to_others(files):
    top = files.root / VOLUMES / "vision" / "data"
    st = os.stat(top)
    assert st.st_mode & 0o777 == 0o700
    if ROOT:
        assert (st.st_uid, st.st_gid) == (4243, 4243)
        assert os.stat(top.parent).st_mode & 0o777 == 0o711


def test_a_file_is_placed_whole_with_its_folders(files):
    staging = _upload(files, b"x" * 1000)
    written = files.place_file("vision", "data", staging, "a/b/é n.txt")
    assert (written.files, written.bytes) == (1, 1000)
    placed = files.root / VOLUMES / "vision" / "data" / "a" / "b" / "é n.txt"
    assert placed.read_bytes() == b"x" * 1000
    if ROOT:
        assert os.stat(placed).st_uid == 4243 and os.stat(placed.parent).st_uid == 4243
    assert files.usage("vision", "data") == (1, 1000)
    assert _leftovers(files) == []


def test_an_upload_past_the_room_left_is_refused_and_leaves_nothing(files):
    staging = files.staging("vision", 100)
    with pytest.raises(OverQuota):
        staging.write(b"y" * 101)
    staging.discard()
    assert _leftovers(files) == []
    assert files.usage("vision", "data") == (0, 0)


def _tar(entries: list[tuple[str, bytes | None]], link: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in entries:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        if link is not None:
            info = tarfile.TarInfo("set/evil")
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
    return buffer.getvalue()


def test_a_tree_is_unpacked_into_the_folder_asked(files):
    data = _tar([("set", None), ("set/x.txt", b"1" * 10), ("set/sub/ü.txt", b"2" * 20)])
    written = _tree(files, data, "in")
    assert (written.files, written.bytes) == (2, 30)
    top = files.root / VOLUMES / "vision" / "data" / "in" / "set"
    assert (top / "sub" / "ü.txt").read_bytes() == b"2" * 20
    again = _tar([("set/x.txt", b"3" * 5), ("set/y.txt", b"4")])  # merged into what is there
    _tree(files, again, "in")
    assert (top / "x.txt").read_bytes() == b"3" * 5 and (top / "sub" / "ü.txt").exists()
    assert _leftovers(files) == []


@pytest.mark.parametrize(
    ("entries", "link"),
    [
        ([("set/ok.txt", b"1"), ("../escape.txt", b"2")], None),
        ([("set/ok.txt", b"1"), ("/etc/escape.txt", b"2")], None),
        ([("set/ok.txt", b"1")], "/etc/passwd"),
    ],
    ids=["dotdot", "absolute", "symlink"],
)
def test_a_tree_with_an_entry_outside_or_a_link_leaves_nothing(files, entries, link):
    staging = _upload(files, _tar(entries, link))
    with pytest.raises(PathRefused):
        files.place_tree("vision", "data", staging, "", 1 << 20)
    staging.discard()  # (the route's, whatever happened)
    assert files.usage("vision", "data") == (0, 0)
    assert _leftovers(files) == []


def test_a_tree_past_the_room_left_leaves_nothing(files):
    staging = _upload(files, _tar([("set/a", b"1" * 600), ("set/b", b"2" * 600)]))
    with pytest.raises(OverQuota):
        files.place_tree("vision", "data", staging, "", 1000)
    staging.discard()
    assert files.usage("vision", "data") == (0, 0)
    assert _leftovers(files) == []


def test_removing_a_path_and_the_volume(files):
    _tree(files, _tar([("set/a", b"1" * 6), ("set/b", b"22")]))
    files.place_file("vision", "data", _upload(files, b"zz"), "top.txt")
    assert files.remove_path("vision", "data", "set") == (2, 8)
    assert files.remove_path("vision", "data", "top.txt") == (1, 2)
    assert files.usage("vision", "data") == (0, 0)
    files.remove("vision", "data")
    assert not (files.root / VOLUMES / "vision" / "data").exists()
    assert _leftovers(files) == []
