"""A job's checkpoint and output folders on the local backend: the same for every attempt, in each replica's
environment, 0700 and its user's (its tenant's on a root platform, in folders others may pass through but not
list), under one storage root that jobs of other users can reach; deleted with the job's directories after its
retention, which counts the bytes it freed. Real executor, real reaper, real processes."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from gpuyard.services.executor import jobenv
from gpuyard.services.executor.__main__ import preflight
from gpuyard.services.executor.jobstorage import check_storage_reachable
from gpuyard.services.executor.retention import JobDirSweeper
from gpuyard.shared.auth.jobtokens import CHECKPOINT_SCOPE, JobTokenError, verify
from gpuyard.shared.contracts.events.jobs import JobCancelled, JobFailed, JobSucceeded
from gpuyard.shared.runtime.paths import job_storage, storage_root
from gpuyard.shared.runtime.storageroot import storage_root_of

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as other users only on a root platform")
DAY = 86400.0
SECRET = b"s" * 32
SHOW = 'echo "$GPUYARD_ATTEMPT $GPUYARD_CHECKPOINT_DIR $GPUYARD_OUTPUT_DIR"'


def log_lines(h, job: str, attempt: int = 1) -> list[str]:
    return (h.data_dir / "jobs" / job / f"attempt-{attempt}" / "replica-0.log").read_text().splitlines()


def mode_and_owner(path: Path) -> tuple[int, int]:
    found = path.stat()
    return stat.S_IMODE(found.st_mode), found.st_uid


@pytest.fixture
def job_root():
    """A job root outside /tmp that every user can pass through (pytest's own folders are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="gpuyard-test-storage-", dir="/var/lib"))
    folder.chmod(0o711)
    yield folder / "jobs"
    shutil.rmtree(folder, ignore_errors=True)


async def test_every_attempt_of_a_job_finds_the_same_folders(h):
    ex = await h.executor()
    command = (
        f'{SHOW}; echo "$GPUYARD_ATTEMPT" >> "$GPUYARD_CHECKPOINT_DIR/attempts"; '
        'echo kept > "$GPUYARD_OUTPUT_DIR/out-$GPUYARD_ATTEMPT"; [ "$GPUYARD_ATTEMPT" = 2 ]'
    )
    job = await h.submit(command=command, max_retries=1, tenant="vision")
    await h.place(ex, job)
    requeued = await h.wait_for(_attempt(h, job, 2), what="the job requeued as attempt 2 (a retry)")
    assert requeued.state.value == "queued"
    await h.place(ex, job, attempt=2)
    await h.wait(job, "succeeded")
    storage = job_storage(h.data_dir / "storage", "vision", job)
    first, second = log_lines(h, job, 1)[0], log_lines(h, job, 2)[0]
    assert first == f"1 {storage.checkpoints} {storage.outputs}"
    assert second == f"2 {storage.checkpoints} {storage.outputs}"
    assert Path(storage.checkpoints, "attempts").read_text() == "1\n2\n"
    assert sorted(os.listdir(storage.outputs)) == ["out-1", "out-2"]
    for folder in storage.folders():
        assert mode_and_owner(Path(folder)) == (0o700, os.geteuid())


def _attempt(h, job: str, number: int):
    async def check():
        view = await h.view(job)
        return view if view.attempt == number else None

    return check


@root_only
async def test_a_tenants_folders_are_its_users_and_out_of_another_tenants_reach(h, job_root):
    ex = await h.executor(job_users="", job_root=job_root)
    root = job_root / "storage"
    assert ex.backend.storage_root == root  # (the data dir is closed to the tenants' users)
    vision = await h.submit(
        command=f'{SHOW}; echo secret > "$GPUYARD_CHECKPOINT_DIR/state"; id -u', tenant="vision"
    )
    await h.place(ex, vision)
    await h.wait(vision, "succeeded")
    uid = ex.backend.job_users.for_tenant("vision").uid
    storage = job_storage(root, "vision", vision)
    assert log_lines(h, vision)[1] == str(uid)
    for folder in storage.folders():
        assert mode_and_owner(Path(folder)) == (0o700, uid)
    assert Path(storage.checkpoints, "state").stat().st_uid == uid
    for parent in (root, root / "checkpoints", root / "checkpoints" / "vision", root / "outputs" / "vision"):
        assert mode_and_owner(parent) == (0o711, 0), parent  # passed through, not listed

    spy = await h.submit(
        command=f"ls {root}/checkpoints/vision || echo no-list; cat {storage.checkpoints}/state || echo no-read",
        tenant="nlp",
    )
    await h.place(ex, spy)
    await h.wait(spy, "succeeded")
    seen = log_lines(h, spy)
    assert "no-list" in seen and "no-read" in seen and "secret" not in seen, seen


@root_only
async def test_a_folder_another_user_owns_fails_the_start_and_is_not_taken_over(h, job_root):
    ex = await h.executor(job_users="", job_root=job_root)
    job = await h.submit(command="true", tenant="vision")
    storage = job_storage(job_root / "storage", "vision", job)
    Path(storage.checkpoints).mkdir(parents=True)
    os.chown(storage.checkpoints, 4242, 4242)
    await h.place(ex, job)
    view = await h.wait(job, "failed")
    assert "cannot make its checkpoint and output folders" in view.message, view.message
    assert Path(storage.checkpoints).stat().st_uid == 4242


@root_only
async def test_a_folder_the_platform_made_for_the_job_is_given_to_its_user(h, job_root):
    """Another node on a shared root, starting a replica of the same job at the same time, made it and has not
    given it to the job's user yet."""
    ex = await h.executor(job_users="", job_root=job_root)
    job = await h.submit(command='touch "$GPUYARD_OUTPUT_DIR/written"', tenant="vision")
    storage = job_storage(job_root / "storage", "vision", job)
    Path(storage.outputs).mkdir(parents=True, mode=0o700)
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    uid = ex.backend.job_users.for_tenant("vision").uid
    assert mode_and_owner(Path(storage.outputs)) == (0o700, uid)
    assert Path(storage.outputs, "written").stat().st_uid == uid


def test_the_storage_root_is_one_setting_with_a_default_jobs_can_reach(h, tmp_path):
    data, jobs = tmp_path / "data", tmp_path / "jobs"
    assert storage_root(None, data, jobs, jobs_switch_users=False) == data / "storage"
    assert storage_root(None, data, jobs, jobs_switch_users=True) == jobs / "storage"
    assert storage_root(tmp_path / "nfs", data, jobs, jobs_switch_users=True) == tmp_path / "nfs"
    settings = h.settings(storage_root=tmp_path / "nfs")
    assert storage_root_of(settings) == tmp_path / "nfs"
    assert storage_root_of(h.settings()) == h.data_dir / "storage"  # (`*=platform`: the platform's rights)
    storage = job_storage(tmp_path / "nfs", "vision", "j1")
    assert (storage.checkpoints, storage.outputs) == (
        f"{tmp_path}/nfs/checkpoints/vision/j1",
        f"{tmp_path}/nfs/outputs/vision/j1",
    )


def test_a_storage_root_other_users_cannot_reach_is_named(tmp_path):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    with pytest.raises(ValueError, match=f"{closed} is not searchable by other users"):
        check_storage_reachable(closed / "storage")
    opened = Path(
        tempfile.mkdtemp(prefix="gpuyard-test-open-", dir="/var/lib" if os.geteuid() == 0 else None)
    )
    try:
        opened.chmod(0o711)
        if all(os.stat(p).st_mode & 0o001 for p in opened.parents):
            check_storage_reachable(opened / "storage" / "not-yet")  # (nothing raised)
    finally:
        shutil.rmtree(opened)


@root_only
def test_the_executor_refuses_to_start_on_a_storage_root_its_jobs_cannot_reach(h, tmp_path, job_root):
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    refused = preflight(h.settings(job_users="", job_root=job_root, storage_root=closed / "storage"))
    assert refused is not None and "storage_root" in refused and str(closed) in refused
    assert preflight(h.settings(job_users="", job_root=job_root)) is None


def test_each_replica_gets_its_folders_and_a_checkpoint_token_for_its_job_alone(tmp_path):
    storage = job_storage(tmp_path, "vision", "j1")
    assert jobenv.storage_env(storage) == {
        "GPUYARD_CHECKPOINT_DIR": storage.checkpoints,
        "GPUYARD_OUTPUT_DIR": storage.outputs,
    }
    try:
        jobenv.configure_publishing(jobenv.Publishing(SECRET, "http://api.test:8080", 3600))
        env = jobenv.identity_env(job_id="j1", job_name="n", tenant="vision", attempt=2, replica=0, node="n1")
        claims = verify(SECRET, env["GPUYARD_CHECKPOINT_TOKEN"], scope=CHECKPOINT_SCOPE)
        assert (claims.tenant, claims.job_id, claims.attempt) == ("vision", "j1", 2)
        with pytest.raises(JobTokenError, match="not 'models:publish'"):
            verify(SECRET, env["GPUYARD_CHECKPOINT_TOKEN"])  # it publishes nothing
        with pytest.raises(JobTokenError, match="not 'jobs:checkpoint'"):
            verify(SECRET, env["GPUYARD_PUBLISH_TOKEN"], scope=CHECKPOINT_SCOPE)
    finally:
        jobenv.configure_publishing(None)


# ---------------------------------------------------------------- retention


def fill(folder: str, size: int) -> None:
    Path(folder).mkdir(parents=True, exist_ok=True)
    Path(folder, "data").write_bytes(b"x" * size)


async def test_the_folders_go_with_the_job_after_its_retention_and_the_bytes_freed_are_counted(h, tmp_path):
    ex = await h.executor()
    root = h.data_dir / "storage"
    done = await h.submit(command=["true"], tenant="vision")
    await h.place(ex, done)
    await h.wait(done, "succeeded")
    await h.deliver(ex, JobSucceeded(job_id=done, attempt=1))
    # requeued after its first attempt failed: it waits for its second
    waiting = await h.submit(command=["false"], tenant="vision", max_retries=1)
    await h.place(ex, waiting)
    await h.wait_for(_attempt(h, waiting, 2), what="the job requeued")
    # ran on another node (only its storage folders are here, on a shared root), and ended
    elsewhere = await h.submit(command=["true"], tenant="nlp")
    await h.ledger.append(elsewhere, JobCancelled(job_id=elsewhere, attempt=1, by="test"))
    for job, tenant in ((done, "vision"), (waiting, "vision"), (elsewhere, "nlp")):
        storage = job_storage(root, tenant, job)
        fill(storage.checkpoints, 3000)
        fill(storage.outputs, 500)
    registry = CollectorRegistry()
    sweeper = JobDirSweeper(
        h.data_dir, h.store, ex.attempts, keep_seconds=7 * DAY, storage_root=root, registry=registry
    )
    assert await sweeper.sweep() == []  # ended just now: kept for its retention
    assert sorted(await sweeper.sweep(now=time.time() + 8 * DAY)) == sorted([done, elsewhere])
    for job, tenant in ((done, "vision"), (elsewhere, "nlp")):
        assert not any(Path(f).exists() for f in job_storage(root, tenant, job).folders())
    assert not (h.data_dir / "jobs" / done).exists()
    kept = job_storage(root, "vision", waiting)  # not final: kept however long it waits
    assert Path(kept.checkpoints, "data").stat().st_size == 3000
    assert (sweeper.freed["checkpoints"], sweeper.freed["outputs"]) == (6000, 1000)
    for what, size in (("checkpoints", 6000), ("outputs", 1000)):
        assert registry.get_sample_value("gpuyard_retention_freed_bytes_total", {"what": what}) == size
    said = sweeper.freed_text({})  # (the node's own job folder holds its log: a few bytes)
    assert said.startswith("freed ") and said.endswith(", checkpoints 6 kB, outputs 1 kB)"), said


async def test_a_failed_jobs_folders_are_kept_while_its_executor_holds_it_and_never_without_retention(h):
    ex = await h.executor()
    root = h.data_dir / "storage"
    job = await h.submit(command=["sleep", "30"], tenant="vision")
    await h.place(ex, job)
    await h.wait(job, "running")
    await h.ledger.append(job, JobFailed(job_id=job, attempt=1, reason="exit_code", message="elsewhere"))
    storage = job_storage(root, "vision", job)
    fill(storage.checkpoints, 10)
    sweeper = JobDirSweeper(h.data_dir, h.store, ex.attempts, keep_seconds=7 * DAY, storage_root=root)
    assert await sweeper.sweep(now=time.time() + 8 * DAY) == []  # this executor still holds its attempt
    never = JobDirSweeper(h.data_dir, h.store, ex.attempts, keep_seconds=0, storage_root=root)
    assert await never.sweep(now=time.time() + 800 * DAY) == []
    assert Path(storage.checkpoints, "data").exists()
