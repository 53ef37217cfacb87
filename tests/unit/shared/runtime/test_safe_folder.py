"""Reading under a folder that jobs write to never leaves it: `..`, absolute paths, NUL bytes, links anywhere on
the way and files of another user (a hard link) are refused; a folder's tar stream is a valid tar of what is
there."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from gpuyard.shared.runtime.safefolder import NotThere, SafeFolder
from gpuyard.shared.runtime.tarstream import PathRefused, clean_path


@pytest.mark.parametrize(
    ("text", "clean"),
    [
        ("a/b.txt", "a/b.txt"),
        ("a//b/", "a/b"),
        ("./a/./b", "a/b"),
        ("", ""),
        (".", ""),
        ("é ñ/x y", "é ñ/x y"),
    ],
)
def test_clean_paths_are_normalised(text, clean):
    assert clean_path(text) == clean


@pytest.mark.parametrize("text", ["../x", "a/../../x", "a/..", "/etc/passwd", "a\0b", "x" * 5000])
def test_paths_that_leave_the_folder_are_refused(text):
    with pytest.raises(PathRefused):
        clean_path(text)


@pytest.fixture
def tree(tmp_path):
    top = tmp_path / "vol"
    (top / "data").mkdir(parents=True)
    (top / "data" / "a.txt").write_text("alpha")
    (top / "b.bin").write_bytes(b"\0" * 3000)
    outside = tmp_path / "secret"
    outside.write_text("not yours")
    (top / "link-out").symlink_to(outside)
    (top / "dir-out").symlink_to(tmp_path)
    return top, outside


def test_a_file_is_read_and_a_folder_listed(tree):
    top, _ = tree
    folder = SafeFolder(top)
    fd, st = folder.open_file("data/a.txt")
    with os.fdopen(fd, "rb") as f:
        assert f.read() == b"alpha"
    assert st.st_size == 5
    entries, more = folder.listing("")
    assert [(e.path, e.kind) for e in entries] == [
        ("b.bin", "file"),
        ("data", "dir"),
        ("dir-out", "other"),
        ("link-out", "other"),
    ]
    assert not more


def test_links_are_never_followed(tree):
    top, _ = tree
    folder = SafeFolder(top)
    with pytest.raises(NotThere):
        folder.open_file("link-out")
    with pytest.raises(PathRefused):
        folder.open_file("dir-out/secret")
    with pytest.raises(PathRefused):
        folder.listing("dir-out")
    assert folder.kind_of("dir-out") == "other"
    assert folder.kind_of("dir-out/secret") is None


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: files of two users")
def test_a_file_of_another_user_is_not_read(tree):
    """A hard link (or any file) that is not the folder's user's is refused where jobs run as other users."""
    top, outside = tree
    os.link(outside, top / "hard")
    for path in (top, top / "data", top / "data" / "a.txt"):
        os.chown(path, 4242, 4242)
    folder = SafeFolder(top, owner=4242)
    fd, _ = folder.open_file("data/a.txt")
    os.close(fd)
    with pytest.raises(NotThere):
        folder.open_file("hard")
    names = _tar_names(b"".join(folder.tar_chunks("")))
    assert "files/data/a.txt" in names and "files/hard" not in names


def _tar_names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getnames()


def test_a_folder_is_sent_as_a_tar_of_its_files_and_folders_only(tree):
    top, _ = tree
    data = b"".join(SafeFolder(top).tar_chunks(""))
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"files/b.bin", "files/data", "files/data/a.txt"}
        assert tar.extractfile(members["files/data/a.txt"]).read() == b"alpha"
        assert members["files/b.bin"].size == 3000
    sub = b"".join(SafeFolder(top).tar_chunks("data"))
    assert _tar_names(sub) == ["data/a.txt"]


def test_usage_counts_regular_files_only(tree):
    top, _ = tree
    assert SafeFolder(top).usage() == (2, 3005)
