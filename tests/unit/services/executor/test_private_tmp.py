"""Tenants do not see each other's temporary files: on a root platform a job that runs as its tenant's user gets
a mount namespace of its own, made by its first process before it leaves root, with its attempt's folders over
/tmp, /var/tmp and /dev/shm, and a proc with hidepid=2 on /proc (Linux 5.8 on); elsewhere its TMPDIR alone is
private. Real executor, real reaper, real processes; the namespace tests need root (as CI runs)."""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path

import pytest

from gpuyard.services.executor.privatetmp import NOT_PRIVATE, SHM_JOBS
from gpuyard.services.executor.processes import Namespaces, kernel_at_least, probe_namespaces, under
from gpuyard.services.executor.reaper_client import ReaperClient
from gpuyard.shared.contracts.events.jobs import FailureReason, JobFailed, JobStarted

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace per job needs a root platform")


@pytest.fixture
def job_root():
    """A job root outside /tmp, /var/tmp and /dev/shm (a job's own /tmp would hide one under them), that every
    user can pass through."""
    folder = Path(tempfile.mkdtemp(prefix="gpuyard-test-jobs-", dir="/var/lib"))
    folder.chmod(0o711)
    yield folder / "jobs"
    shutil.rmtree(folder, ignore_errors=True)


def log_of(h, job: str) -> str:
    return (h.data_dir / "jobs" / job / "attempt-1" / "replica-0.log").read_text()


async def started(h, job: str) -> JobStarted:
    return next(e.data for e in await h.ledger.events(job) if isinstance(e.data, JobStarted))


@root_only
@pytest.mark.parametrize("start", ["helper", "fork"])  # (the start helper's C, or the reaper's forked child)
async def test_a_tenant_cannot_reach_another_tenants_tmp_nor_see_its_processes(h, job_root, start):
    """The attack a shared /tmp allows (protected_regular=0): a tenant leaves a file open to all and a link in
    /tmp and reads what another tenant's job writes through them. Here each job finds its own /tmp empty, the
    other's files never meet, and /proc does not list the other tenant's process."""
    ex = await h.executor(job_users="", job_root=job_root, replica_start=start)
    if not ex.backend.private.namespaces.mounts:
        pytest.skip(f"no mount namespaces on this node: {ex.backend.private.namespaces.reason}")
    if hidden := ex.backend.private.hidden:  # (a checkout under /tmp: a mount over it would hide its Python)
        pytest.skip(f"no private /tmp for jobs here: the platform's Python is under {hidden}")
    name = f"results-{uuid.uuid4().hex[:8]}"
    trap = (
        f"find /tmp /var/tmp /dev/shm -mindepth 1 | wc -l; echo TMPDIR=$TMPDIR; touch /tmp/{name}; chmod 666 /tmp/{name}; "
        f"ln -s /tmp/{name} /tmp/{name}.link; touch /dev/shm/{name}; chmod 666 /dev/shm/{name}; "
        "while [ ! -s go ]; do sleep 0.05; done; victim=$(cat go); "
        f"cat /tmp/{name} /dev/shm/{name}; echo read-done; "
        'cat /proc/$victim/cmdline || echo no-cmdline; ls /proc | grep -cx "$victim" || true'
    )
    attacker = await h.submit(command=trap, tenant="nlp")
    await h.place(ex, attacker)
    attacker_work = job_root / attacker / "attempt-1" / "work-0"
    link = job_root / attacker / "attempt-1" / "tmp" / f"{name}.link"
    await h.wait_for(link.is_symlink, what="the trap set")

    victim = await h.submit(
        command=f"find /tmp /var/tmp /dev/shm -mindepth 1 | wc -l; echo TMPDIR=$TMPDIR; "
        f"echo secret > /tmp/{name}; echo secret > /tmp/{name}.link; echo secret > /dev/shm/{name}; "
        "echo $$ > pid; exec sleep 60",
        tenant="vision",
    )
    await h.place(ex, victim)
    victim_work = job_root / victim / "attempt-1" / "work-0"
    pid = await h.wait_for(
        lambda: (victim_work / "pid").exists() and (victim_work / "pid").read_text().strip()
    )
    victim_tmp = job_root / victim / "attempt-1" / "tmp"
    assert (victim_tmp / name).read_text() == "secret\n"  # (its own /tmp: the folder of its attempt's)
    (attacker_work / "go").write_text(pid)
    await h.wait(attacker, "succeeded")

    spied = log_of(h, attacker).splitlines()
    assert spied[0] == "0" and spied[1] == "TMPDIR=/tmp", spied  # its own /tmp, empty at its start
    assert "secret" not in spied and "read-done" in spied, spied
    assert "no-cmdline" in spied or not ex.backend.private.namespaces.hide_pids
    if ex.backend.private.namespaces.hide_pids:
        assert spied[-1] == "0", spied  # /proc lists no process of the other tenant
    seen = log_of(h, victim).splitlines()
    assert seen[:2] == ["0", "TMPDIR=/tmp"], seen  # nothing of the other tenant's in its /tmp nor /dev/shm
    for event in (await started(h, attacker), await started(h, victim)):
        assert event.isolation.startswith(
            "private /tmp, /var/tmp and /dev/shm (a mount namespace of its own)"
        )
        assert ("its user's processes only" in event.isolation) == ex.backend.private.namespaces.hide_pids
    assert not os.path.exists(f"/tmp/{name}") and not os.path.exists(f"/dev/shm/{name}")  # (the node's)
    uid = ex.backend.job_users.for_tenant("vision").uid
    assert (victim_tmp.stat().st_uid, stat.S_IMODE(victim_tmp.stat().st_mode)) == (uid, 0o700)

    attacker_tmp = job_root / attacker / "attempt-1" / "tmp"
    await h.wait_for(lambda: not attacker_tmp.exists(), what="the ended job's /tmp deleted")
    assert not Path(f"{SHM_JOBS}/{attacker}-1").exists()
    os.killpg(int(pid), 9)
    await h.wait(victim, "failed")
    await h.wait_for(lambda: not victim_tmp.exists(), what="the ended job's /tmp deleted")
    assert not Path(f"{SHM_JOBS}/{victim}-1").exists()


async def test_a_job_of_the_platforms_user_gets_a_private_tmpdir_deleted_at_its_end(h):
    """Without a namespace (the platform's own user: any platform, root or not) TMPDIR is a folder of the
    attempt's, 0700, deleted when its last replica ends."""
    ex = await h.executor()
    job = await h.submit(command='echo "$TMPDIR"; ls -A "$TMPDIR" | wc -l; stat -c %a "$TMPDIR"', replicas=1)
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    folder = h.data_dir / "jobs" / job / "attempt-1" / "tmp"
    assert log_of(h, job).split() == [str(folder), "0", "700"]
    assert (await started(h, job)).isolation.startswith("private TMPDIR only: ")
    await h.wait_for(lambda: not folder.exists(), what="its TMPDIR deleted")


async def test_a_tmpdir_of_the_jobs_own_env_wins(h):
    ex = await h.executor()
    job = await h.submit(command='echo "$TMPDIR"', env={"TMPDIR": "/scratch/mine"})
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    assert log_of(h, job).split() == ["/scratch/mine"]


@root_only
async def test_a_job_root_under_tmp_gets_a_private_tmpdir_and_says_why(h):
    """A namespace would hide a working directory under /tmp: the job gets its private TMPDIR (its user's,
    0700) and its job.started says why it has no private /tmp."""
    base = Path(tempfile.mkdtemp(prefix="gpuyard-jobs-", dir="/tmp"))
    base.chmod(0o711)
    try:
        ex = await h.executor(job_users="", job_root=base / "jobs")
        job = await h.submit(command='echo "$TMPDIR"; stat -c "%u %a" "$TMPDIR"', tenant="vision")
        await h.place(ex, job)
        await h.wait(job, "succeeded")
        folder = base / "jobs" / job / "attempt-1" / "tmp"
        uid = ex.backend.job_users.for_tenant("vision").uid
        assert log_of(h, job).split() == [str(folder), str(uid), "700"]
        isolation = (await started(h, job)).isolation
        assert isolation.startswith("private TMPDIR only: ") and "/tmp" in isolation, isolation
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_what_the_node_allows_is_found_by_trying_it(monkeypatch):
    assert kernel_at_least((5, 8), "5.8.0-63-generic") and kernel_at_least((5, 8), "6.1.0")
    assert not kernel_at_least((5, 8), "5.4.0-150-generic") and not kernel_at_least((5, 8), "weird")
    assert under("/tmp/a/b", ("/var/tmp", "/tmp")) == "/tmp" and under("/tmpfs/a", ("/tmp",)) is None
    if os.geteuid() == 0:
        found = probe_namespaces()
        assert isinstance(found, Namespaces) and (found.mounts or found.reason)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert probe_namespaces() == Namespaces(False, False, "the platform is not root")


@root_only
async def test_a_replica_started_without_the_namespace_it_asked_for_does_not_run(h, job_root, monkeypatch):
    """A private /tmp is never claimed without being there: a replica found in the executor's own mount
    namespace (a reaper that ignored the request) is stopped and its start fails, saying so."""
    real = ReaperClient.start

    async def ignoring(self, argv, **kwargs):
        kwargs.pop("binds", None), kwargs.pop("hide_pids", None)
        return await real(self, argv, **kwargs)

    monkeypatch.setattr(ReaperClient, "start", ignoring)
    ex = await h.executor(job_users="", job_root=job_root)
    if not ex.backend.private.namespaces.mounts:
        pytest.skip(f"no mount namespaces on this node: {ex.backend.private.namespaces.reason}")
    if hidden := ex.backend.private.hidden:  # (a checkout under /tmp: a mount over it would hide its Python)
        pytest.skip(f"no private /tmp for jobs here: the platform's Python is under {hidden}")
    job = await h.submit(command="sleep 30", tenant="vision")
    await h.place(ex, job)
    await h.wait(job, "failed")
    failed = next(e.data for e in await h.ledger.events(job) if isinstance(e.data, JobFailed))
    assert failed.reason == FailureReason.START_FAILED and failed.message.endswith(NOT_PRIVATE)
    await h.wait_for(lambda: not (job_root / job / "attempt-1" / "tmp").exists(), what="its /tmp deleted")
