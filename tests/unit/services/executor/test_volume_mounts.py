"""A replica's volumes: bound at their paths where it has a mount namespace (read-only ones listed for the
remount), links elsewhere with a note that read-only is not enforced, the variables, and the refusals (a volume
not on the node, an absolute path, a place taken, a link planted on the way)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuyard.services.executor.volumemounts import MountError, env_name, make_mount_points, plan
from gpuyard.shared.contracts.jobspec import VolumeMount
from gpuyard.shared.runtime.paths import volume_dir


@pytest.fixture
def root(tmp_path):
    for name in ("imagenet", "scratch"):
        os.makedirs(volume_dir(tmp_path / "storage", "vision", name))
    return str(tmp_path / "storage")


@pytest.fixture
def cwd(tmp_path):
    folder = tmp_path / "work"
    folder.mkdir()
    return str(folder)


VOLUMES = [
    VolumeMount(name="imagenet", path="data/imagenet", read_only=True),
    VolumeMount(name="scratch", path="scratch"),
]


def test_with_a_namespace_volumes_are_bound_and_read_only_ones_remounted(root, cwd):
    mounts = plan(VOLUMES, root=root, tenant="vision", cwd=cwd, namespace=True)
    source = str(volume_dir(root, "vision", "imagenet"))
    assert mounts.binds[0] == (source, f"{cwd}/data/imagenet")
    assert mounts.read_only == (f"{cwd}/data/imagenet",)
    assert mounts.links == () and mounts.notes == ()
    assert mounts.env == {
        "GPUYARD_VOLUME_IMAGENET": f"{cwd}/data/imagenet",
        "GPUYARD_VOLUME_SCRATCH": f"{cwd}/scratch",
    }
    make_mount_points(mounts, cwd, None)
    assert os.path.isdir(f"{cwd}/data/imagenet") and not os.path.islink(f"{cwd}/data/imagenet")
    make_mount_points(mounts, cwd, None)  # another replica of the attempt, in the same working directory


def test_without_one_they_are_links_and_the_note_says_read_only_is_not_enforced(root, cwd):
    mounts = plan(VOLUMES, root=root, tenant="vision", cwd=cwd, namespace=False, why_none="not root")
    assert mounts.binds == ()
    assert len(mounts.notes) == 1 and "read-only not enforced" in mounts.notes[0]
    assert (
        "imagenet" in mounts.notes[0] and "scratch" not in mounts.notes[0] and "not root" in mounts.notes[0]
    )
    make_mount_points(mounts, cwd, None)
    assert os.readlink(f"{cwd}/data/imagenet") == str(volume_dir(root, "vision", "imagenet"))
    (volume_dir(root, "vision", "imagenet") / "x.txt").write_text("seen")
    assert Path(f"{cwd}/data/imagenet/x.txt").read_text() == "seen"


def test_env_names():
    assert env_name("image-net-2") == "GPUYARD_VOLUME_IMAGE_NET_2"


def test_a_volume_not_on_the_node_or_an_absolute_path_is_refused(root, cwd):
    with pytest.raises(MountError, match="not in this node's storage root"):
        plan([VolumeMount(name="gone", path="x")], root=root, tenant="vision", cwd=cwd, namespace=True)
    with pytest.raises(MountError, match="another tenant|not in this node"):
        plan([VolumeMount(name="imagenet", path="x")], root=root, tenant="nlp", cwd=cwd, namespace=True)
    with pytest.raises(MountError, match="relative path"):
        plan(
            [VolumeMount(name="imagenet", path="/data")], root=root, tenant="vision", cwd=cwd, namespace=True
        )


def test_a_place_taken_or_a_link_on_the_way_is_refused(root, cwd, tmp_path):
    (tmp_path / "work" / "scratch").write_text("a file of the job's")
    mounts = plan(VOLUMES[1:], root=root, tenant="vision", cwd=cwd, namespace=False)
    with pytest.raises(MountError, match="something else is there"):
        make_mount_points(mounts, cwd, None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, f"{cwd}/data")
    mounts = plan(VOLUMES[:1], root=root, tenant="vision", cwd=cwd, namespace=True)
    with pytest.raises(MountError):
        make_mount_points(mounts, cwd, None)
    assert os.listdir(elsewhere) == []  # nothing made through the link
