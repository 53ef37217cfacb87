"""A replica's folders (its working directory, its private TMPDIR, its job's checkpoint and output folders) are
made by its first process, not by the executor, whose event loop makes none of them: only the storage root's
folders of a tenant, once. One that is another user's is refused, never taken over, and the failure says which;
one above them removed by hand fails that start and is made again for the next. Real executor, real reaper,
real processes."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from gpuyard.shared.runtime.paths import job_storage

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other users only on a root platform")


@pytest.fixture
def job_root():
    """A job root outside /tmp that every user can pass through (pytest's own folders are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="gpuyard-test-folders-", dir="/var/lib"))
    folder.chmod(0o711)
    yield folder / "jobs"
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def mkdirs(monkeypatch) -> list[str]:
    """Every folder this process (the executor) makes from now on."""
    made: list[str] = []
    real = os.mkdir

    def mkdir(path, *args, **kwargs):
        made.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    return made


def mode_and_owner(path: Path) -> tuple[int, int]:
    found = path.lstat()
    return stat.S_IMODE(found.st_mode), found.st_uid


@pytest.mark.parametrize("start", ["helper", "fork"])
async def test_the_executor_makes_none_of_a_replicas_folders_and_the_storage_roots_once(h, mkdirs, start):
    ex = await h.executor(replica_start=start)
    root = ex.backend.storage_root
    made_for = {}
    for _ in range(2):  # (two jobs of one tenant)
        job = await h.submit(command='pwd; echo "$TMPDIR"', tenant="vision")
        await h.place(ex, job)
        await h.wait(job, "succeeded")
        made_for[job] = list(mkdirs)
        mkdirs.clear()
    for job, made in made_for.items():
        attempt = h.data_dir / "jobs" / job / "attempt-1"
        storage = job_storage(root, "vision", job)
        mine = [attempt / "work-0", attempt / "tmp", Path(storage.checkpoints), Path(storage.outputs)]
        assert (attempt / "replica-0.log").read_text().split() == [str(attempt / "work-0"), str(mine[1])]
        for folder in mine[:1] + mine[2:]:
            assert mode_and_owner(folder) == (0o700, os.geteuid())
        assert not {str(folder) for folder in mine} & set(made), made
    first, second = made_for.values()
    assert f"{root}/checkpoints/vision" in first  # (the storage root's folders of the tenant: once)
    assert not [path for path in second if path.startswith(str(root))], second


@root_only
@pytest.mark.parametrize("start", ["helper", "fork"])
async def test_a_working_directory_another_user_owns_is_refused_and_not_taken_over(h, job_root, start):
    ex = await h.executor(job_users="", job_root=job_root, replica_start=start)
    job = await h.submit(command="touch ran", tenant="vision")
    work = job_root / job / "attempt-1" / "work-0"
    work.mkdir(parents=True)
    os.chown(work, 4242, 4242)
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert view.failure_reason == "start_failed", view.message
    assert "cannot make its working directory: one is there that is not its own" in view.message, view.message
    assert mode_and_owner(work)[1] == 4242 and not (work / "ran").exists()


@root_only
async def test_the_folders_of_a_job_that_runs_as_its_tenants_user(h, job_root):
    """Its working directory and private /tmp its user's (0700), in its attempt's folders of the platform's
    (0711: passed through, not listed)."""
    ex = await h.executor(job_users="", job_root=job_root)
    job = await h.submit(command="id -u; pwd", tenant="vision")
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    uid = ex.backend.job_users.for_tenant("vision").uid
    attempt = job_root / job / "attempt-1"
    log = (h.data_dir / "jobs" / job / "attempt-1" / "replica-0.log").read_text().split()
    assert log == [str(uid), str(attempt / "work-0")]
    for folder in (job_root / job, attempt):
        assert mode_and_owner(folder) == (0o711, 0)
    assert mode_and_owner(attempt / "work-0") == (0o700, uid)


async def test_a_storage_folder_removed_by_hand_fails_one_start_and_is_made_again(h):
    ex = await h.executor()
    first = await h.submit(command="true", tenant="vision")
    await h.place(ex, first)
    await h.wait(first, "succeeded")
    shutil.rmtree(ex.backend.storage_root / "checkpoints" / "vision")
    second = await h.submit(command="true", tenant="vision")
    await h.place(ex, second)
    view = await h.wait(second, "failed")
    assert view.message.endswith("cannot make its checkpoint and output folders: No such file or directory")
    third = await h.submit(command="true", tenant="vision")
    await h.place(ex, third)
    await h.wait(third, "succeeded")
