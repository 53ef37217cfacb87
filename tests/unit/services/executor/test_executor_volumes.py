"""A job's volumes on the local backend (docs/volumes.md): on a root platform, on a node that allows mount
namespaces, each replica finds the volume's own folder bound at its path in a mount namespace of its own,
read-only when asked (a write there fails with "Read-only file system"), whether it runs as its tenant's user or
the platform's; without one (a platform that is not root, a node without namespaces), a link to it, and the
attempt's notes say read-only is not enforced. A volume that is not on the node's
storage root, or a place the local backend cannot mount at, fails the start with its reason. Real executor,
real reaper, real processes."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from gpuyard.services.executor import privatetmp
from gpuyard.services.executor.processes import Namespaces
from gpuyard.services.executor.volumemounts import env_name
from gpuyard.shared.contracts.events.jobs import JobStarted
from gpuyard.shared.runtime.paths import volume_dir

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace per job needs a root platform")
READ = (
    'cat data/set/file; echo; echo "at=$GPUYARD_VOLUME_DATASET"; touch scratch/written && echo wrote-scratch; '
    "touch data/new || echo refused"
)


@pytest.fixture
def job_root():
    """A job root outside /tmp, /var/tmp and /dev/shm (a job's own /tmp would hide one under them), that every
    user can pass through."""
    folder = Path(tempfile.mkdtemp(prefix="gpuyard-test-volumes-", dir="/var/lib"))
    folder.chmod(0o711)
    yield folder / "jobs"
    shutil.rmtree(folder, ignore_errors=True)


def make_volume(root: Path, tenant: str, name: str, owner: tuple[int, int] | None) -> Path:
    """A volume's folder as the submit service makes it: 0700, its tenant's user's, in folders of the platform's
    that every user passes through (0711)."""
    folder = volume_dir(root, tenant, name)
    for step in reversed([folder.parent, *folder.parent.parents]):
        if not step.exists():
            step.mkdir(mode=0o711)
            step.chmod(0o711)
    folder.mkdir(mode=0o700)
    (folder / "set").mkdir()
    (folder / "set" / "file").write_text(f"{name} data")
    if owner:
        for path in (folder, folder / "set", folder / "set" / "file"):
            os.chown(path, *owner)
    return folder


def log_of(h, job: str) -> str:
    return (h.data_dir / "jobs" / job / "attempt-1" / "replica-0.log").read_text()


VOLUMES = [{"name": "dataset", "path": "data", "read_only": True}, {"name": "scratch", "path": "scratch"}]


@root_only
@pytest.mark.parametrize("start", ["helper", "fork"])  # (the start helper's C, or the reaper's forked child)
@pytest.mark.parametrize("users", ["", "*=platform"])  # (its tenant's user, or the platform's own)
async def test_a_read_only_volume_is_bound_where_the_job_sees_it_and_refuses_its_writes(
    h, job_root, start, users
):
    ex = await h.executor(job_users=users, job_root=job_root, replica_start=start)
    if not (found := await ex.backend.private.probe()).mounts:
        pytest.skip(f"no mount namespaces on this node: {found.reason}")
    user = ex.backend.job_users.for_tenant("vision")
    root = ex.backend.storage_root
    make_volume(root, "vision", "dataset", (user.uid, user.gid) if user else None)
    scratch = make_volume(root, "vision", "scratch", (user.uid, user.gid) if user else None)
    job = await h.submit(command=READ, tenant="vision", volumes=VOLUMES)
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    work = (
        job_root / job / "attempt-1" / "work-0"
        if user
        else h.data_dir / "jobs" / job / "attempt-1" / "work-0"
    )
    lines = log_of(h, job).splitlines()
    assert lines[0] == "dataset data" and lines[1] == f"at={work}/data", lines
    assert "wrote-scratch" in lines and lines[-1] == "refused", lines
    assert "Read-only file system" in log_of(h, job)
    assert (scratch / "written").stat().st_uid == (
        user.uid if user else 0
    )  # (the volume's own folder: no copy)
    assert not (volume_dir(root, "vision", "dataset") / "new").exists()
    assert (
        (work / "data").is_dir() and not (work / "data").is_symlink() and not os.path.ismount(work / "data")
    )
    assert ex.backend.notes((job, 1)) == []  # (nothing the node could not do)


async def test_without_a_namespace_a_volume_is_a_link_and_the_notes_say_read_only_is_not_enforced(
    h, monkeypatch
):
    if os.geteuid() == 0:  # (a node that allows none)
        no_namespaces = Namespaces(False, False, "no mount namespace here (not allowed)")
        monkeypatch.setattr(privatetmp, "probe_namespaces", lambda: no_namespaces)
    ex = await h.executor()
    root = ex.backend.storage_root
    dataset = make_volume(root, "vision", "dataset", None)
    make_volume(root, "vision", "scratch", None)
    job = await h.submit(command=f"{READ}; echo $$ > pid; exec sleep 30", tenant="vision", volumes=VOLUMES)
    await h.place(ex, job)
    work = Path(h.data_dir / "jobs" / job / "attempt-1" / "work-0")
    pid = await h.wait_for(lambda: (work / "pid").exists() and (work / "pid").read_text().strip())
    # (the log is the executor's copy of the job's output: it may lag the pid file; the last line it writes ends it)
    await h.wait_for(lambda: "wrote-scratch" in log_of(h, job).splitlines())
    lines = log_of(h, job).splitlines()
    assert lines[0] == "dataset data" and "wrote-scratch" in lines and "refused" not in lines, lines
    assert os.readlink(work / "data") == str(dataset) and (dataset / "new").exists()
    (notes,) = ex.backend.notes((job, 1))
    assert (
        notes.startswith("read-only not enforced on this node for volume dataset: ")
        and "scratch" not in notes
    )
    started = next(e.data for e in await h.ledger.events(job) if isinstance(e.data, JobStarted))
    assert started.isolation.startswith("private TMPDIR only: ")
    os.killpg(int(pid), 9)
    await h.wait(job, "failed")
    assert ex.backend.notes((job, 1)) == []  # (forgotten with the attempt)


@pytest.mark.parametrize(
    ("volumes", "words"),
    [
        ([{"name": "gone", "path": "data"}], "volume 'gone' is not in this node's storage root"),
        ([{"name": "dataset", "path": "/data"}], "give a relative path, not '/data'"),
    ],
)
async def test_a_volume_the_node_cannot_mount_fails_the_start_with_its_reason(h, volumes, words):
    ex = await h.executor()
    make_volume(ex.backend.storage_root, "vision", "dataset", None)
    job = await h.submit(command="echo never", tenant="vision", volumes=volumes)
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed" and words in view.message, view.message
    assert "started" not in await h.types(job)


async def test_each_replica_finds_its_volume_in_its_variable(h):
    ex = await h.executor()
    make_volume(ex.backend.storage_root, "vision", "my-set", None)
    variable = env_name("my-set")
    job = await h.submit(
        command=f'cat "${variable}/set/file"', tenant="vision", volumes=[{"name": "my-set", "path": "in/set"}]
    )
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    assert variable == "GPUYARD_VOLUME_MY_SET" and log_of(h, job) == "my-set data"


async def test_a_volume_in_an_object_store_is_copied_to_the_node_and_read_by_the_job(
    h,
    s3_server,  # noqa: F811 (a fixture)
    bucket,  # noqa: F811 (a fixture)
):
    """GPUYARD_VOLUME_STORE set: the executor copies the volume from the store before the replica starts, and
    the job reads the copy where it asked for it, read-only; the attempt's notes say what was copied."""
    s3_server.client().put_object(Bucket=bucket, Key="yard/volumes/vision/dataset/set/file", Body=b"s3 data")
    ex = await h.executor(volume_store=f"s3://{bucket}/yard")
    job = await h.submit(
        command='cat data/set/file; echo; echo "at=$GPUYARD_VOLUME_DATASET"',
        tenant="vision",
        volumes=[{"name": "dataset", "path": "data", "read_only": True}],
    )
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    lines = log_of(h, job).splitlines()
    assert lines[0] == "s3 data" and lines[1].startswith("at="), lines
    started = next(e.data for e in await h.ledger.events(job) if isinstance(e.data, JobStarted))
    assert any(n.startswith("volume dataset: copied 1 file (7 B)") for n in started.notes), (
        started.notes,
        log_of(h, job),
    )
