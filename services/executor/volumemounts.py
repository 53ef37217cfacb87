"""The volumes a replica of the local backend mounts (`volumes:` in its spec, docs/volumes.md).

No data is copied: the replica sees the volume's own folder (`volume_dir`) at its path, relative to its working
directory. Where it gets a mount namespace of its own (a root platform on a node that allows them:
`privatetmp.py`, `PrivateTmps.volume_namespace`), its first process binds the folder there, and remounts it
read-only when the spec asks (`reaper/kernel.py`, replica_start.c): the kernel refuses its writes. Elsewhere the
path is a symbolic link to the folder, which cannot make it read-only: its `job.started` says so (`notes`). Each
replica also finds the folder in `GPUYARD_VOLUME_<NAME>`.

A volume in an object store (`GPUYARD_VOLUME_STORE`) is mounted the same way from the node's copy of it
(`volumecache.py`, `Cached`), always read-only."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field

from gpuyard.shared.contracts.jobspec import VolumeMount
from gpuyard.shared.runtime.jobusers import JobUser
from gpuyard.shared.runtime.paths import volume_dir
from gpuyard.shared.runtime.safefolder import NotThere, SafeFolder
from gpuyard.shared.runtime.tarstream import PathRefused, clean_path

READ_ONLY_NOT_ENFORCED = (
    "read-only not enforced on this node for volume {names}: its replicas have no mount namespace of their own "
    "({why}), so the volume is a link they may write through"
)


class MountError(Exception):
    """A volume the replica cannot be given; the message says why (the start fails with it)."""


def env_name(volume: str) -> str:
    """`GPUYARD_VOLUME_<NAME>`: the name in capitals, `-` as `_`."""
    return "GPUYARD_VOLUME_" + volume.upper().replace("-", "_")


@dataclass(frozen=True)
class Mounts:
    """What a replica's start does for its volumes."""

    binds: tuple[tuple[str, str], ...] = ()
    """(folder, over) pairs for its mount namespace."""
    read_only: tuple[str, ...] = ()
    """Of those, the places remounted read-only."""
    links: tuple[tuple[str, str], ...] = ()
    """(link, folder) pairs where it has no namespace."""
    env: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Cached:
    """The node's copies of volumes in an object store (`volumecache.py`): volume name -> its copy's folder, and
    what each copy did (for the attempt's `job.started` notes)."""

    sources: dict[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


def plan(
    volumes: list[VolumeMount],
    *,
    root: str,
    tenant: str,
    cwd: str,
    namespace: bool,
    why_none: str = "",
    cached: Cached | None = None,
) -> Mounts:
    """The mounts of a replica of `tenant` working in `cwd`: binds when it gets a `namespace`, links otherwise
    (`why_none`: why it does not, in the note said for a volume asked read-only); a volume `cached` from an
    object store from its copy, read-only. MountError for a volume that is not on this node's storage root or a
    path it cannot be put at."""
    if not volumes:
        return Mounts()
    copies = cached or Cached()
    binds, read_only, links, env, unenforced = [], [], [], {}, []
    for v in volumes:
        source = copies.sources.get(v.name) or str(volume_dir(root, tenant, v.name))
        ro = v.read_only or v.name in copies.sources
        if not os.path.isdir(source):
            raise MountError(
                f"volume {v.name!r} is not in this node's storage root (deleted, or a storage root that is not "
                "shared by every node)"
            )
        if os.path.isabs(v.path):
            raise MountError(
                f"volume {v.name!r}: the local backend mounts volumes inside the working directory; give a "
                f"relative path, not {v.path!r}"
            )
        target = os.path.join(cwd, v.path)
        env[env_name(v.name)] = target
        if namespace:
            binds.append((source, target))
            if ro:
                read_only.append(target)
        else:
            links.append((target, source))
            if ro:
                unenforced.append(v.name)
    notes = copies.notes
    if unenforced:
        notes += (
            READ_ONLY_NOT_ENFORCED.format(names=", ".join(unenforced), why=why_none or "not available"),
        )
    return Mounts(tuple(binds), tuple(read_only), tuple(links), env, notes)


def make_mount_points(mounts: Mounts, cwd: str, user: JobUser | None) -> None:
    """The folders the binds go over (empty, the job user's) and the links, with the folders above them, made
    from the working directory down without following a link (a working directory of the spec's may hold links a
    job made). A place already taken by something else is a MountError; one made by another replica of the
    attempt (a shared working directory) is kept."""
    ids = (user.uid, user.gid) if user else (os.geteuid(), os.getegid())
    top = SafeFolder(cwd)
    for place, source in [*((t, None) for _, t in mounts.binds), *mounts.links]:
        try:
            parent, _, leaf = clean_path(os.path.relpath(place, cwd)).rpartition("/")
            dfd = top.open_dir(parent, create=ids)
        except (PathRefused, NotThere) as exc:
            raise MountError(f"cannot mount a volume at {place}: {exc}") from None
        try:
            _make(dfd, leaf, source, ids)
        except FileExistsError:
            raise MountError(f"cannot mount a volume at {place}: something else is there") from None
        finally:
            os.close(dfd)


def _make(dfd: int, leaf: str, source: str | None, ids: tuple[int, int]) -> None:
    """A folder to bind over (source None), or a link to `source`, at `leaf` of the folder `dfd`."""
    try:
        st = os.stat(leaf, dir_fd=dfd, follow_symlinks=False)
    except FileNotFoundError:
        if source is None:
            os.mkdir(leaf, 0o755, dir_fd=dfd)
        else:
            os.symlink(source, leaf, dir_fd=dfd)
        os.chown(leaf, *ids, dir_fd=dfd, follow_symlinks=False)
        return
    if source is None and stat.S_ISDIR(st.st_mode):
        return  # (a folder there: the bind goes over it)
    if source is not None and stat.S_ISLNK(st.st_mode) and os.readlink(leaf, dir_fd=dfd) == source:
        return
    raise FileExistsError(leaf)
