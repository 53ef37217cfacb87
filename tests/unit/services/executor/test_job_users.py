"""Jobs without the platform's rights: on a root platform each tenant's jobs run as an
unprivileged user of its own, which cannot read the platform's files or another tenant's working directory,
nor signal another tenant's processes. Real executor, real processes; the tests that switch users need root."""

from __future__ import annotations

import os
import signal
import stat
import tempfile
from pathlib import Path

import pytest

from gpuyard.services.executor.processes import process_start_time
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.runtime.jobusers import JobUser, JobUsers
from gpuyard.shared.runtime.paths import unreachable_to_others

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="switching a job's user needs root (as in CI)")


def test_the_setting_maps_tenants_to_users_and_never_to_root():
    users = JobUsers.from_setting("vision=nobody, nlp=1500:1600, *=1700", 2_000_000, root=True)
    assert users.for_tenant("vision").uid == 65534
    assert users.for_tenant("nlp") == JobUser(1500, 1600, users.for_tenant("nlp").name)
    assert users.for_tenant("other").uid == 1700
    for bad, words in [
        ("vision", "is not tenant=user"),
        ("vision=no-such-user-here", "no user 'no-such-user-here'"),
        ("vision=root", "a job never runs as root"),
        ("*=0:5", "a job never runs as root"),
    ]:
        with pytest.raises(ValueError, match=words):
            JobUsers.from_setting(bad, 2_000_000, root=True)
    with pytest.raises(ValueError, match="only a platform running as root"):
        JobUsers.from_setting("vision=nobody", 2_000_000, root=False)


def test_by_default_each_tenant_gets_its_own_uid_on_root_and_none_elsewhere():
    users = JobUsers.from_setting("", 2_000_000, root=True)
    vision, nlp = users.for_tenant("vision"), users.for_tenant("nlp")
    assert vision != nlp and min(vision.uid, nlp.uid) >= 2_000_000 and vision.uid == vision.gid
    assert users.for_tenant("vision") == vision  # the same on every executor, every time
    assert users.switches and not users.shared_rights
    laptop = JobUsers.from_setting("", 2_000_000, root=False)
    assert laptop.for_tenant("vision") is None and laptop.shared_rights
    assert JobUsers.from_setting("*=platform", 2_000_000, root=True).shared_rights


@pytest.fixture
def job_root():
    """A job root every user can reach (pytest's own folders are 0700)."""
    folder = Path(tempfile.mkdtemp(prefix="gpuyard-jobs-", dir="/tmp"))
    folder.chmod(0o711)
    yield folder / "jobs"
    for path in sorted(folder.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    folder.rmdir()


@root_only
@pytest.mark.parametrize("start", ["helper", "fork"])  # (the start helper's C, or the reaper's forked child)
async def test_a_job_runs_as_its_tenants_user_and_cannot_read_the_platforms_files(
    h, tmp_path, job_root, start
):
    Tokens(h.data_dir / "tokens.json").create(tenant="admin", admin=True)
    ex = await h.executor(job_users="", job_root=job_root, replica_start=start)
    tokens, events = h.data_dir / "tokens.json", h.tmp_path / "events.db"
    job = await h.submit(
        command=f"id -u; id -G; cat {tokens} || echo no-tokens; cat {events} || echo no-events; "
        f"ls {h.data_dir} || echo no-data-dir; pwd; touch mine",
        tenant="vision",
    )
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    uid = ex.backend.job_users.for_tenant("vision").uid
    lines = (h.data_dir / "jobs" / job / "attempt-1" / "replica-0.log").read_text().splitlines()
    work = job_root / job / "attempt-1" / "work-0"
    assert lines[0] == str(uid) and lines[1] == str(uid)  # its uid, its gid, no supplementary group
    assert "no-tokens" in lines and "no-events" in lines and "no-data-dir" in lines
    assert lines[-1] == str(work)
    assert (work.stat().st_uid, stat.S_IMODE(work.stat().st_mode)) == (uid, 0o700)
    assert (work / "mine").stat().st_uid == uid
    assert stat.S_IMODE(job_root.stat().st_mode) == 0o711 and job_root.stat().st_uid == 0


@root_only
@pytest.mark.parametrize("start", ["helper", "fork"])
async def test_a_command_looked_up_on_the_path_starts_as_the_tenants_user(h, job_root, start):
    """`["id", "-u"]` is found on the PATH by the replica's first process after it became the job's user, who
    may not read the platform's Python (a private /root): a forked child must not import anything then."""
    ex = await h.executor(job_users="", job_root=job_root, replica_start=start)
    job = await h.submit(command=["id", "-u"], tenant="vision")
    await h.place(ex, job)
    await h.wait(job, "succeeded")
    lines = (h.data_dir / "jobs" / job / "attempt-1" / "replica-0.log").read_text().split()
    assert lines == [str(ex.backend.job_users.for_tenant("vision").uid)]


def test_a_folder_closed_to_other_users_is_named(job_root):
    base = job_root.parent  # (0711 under /tmp: pytest's own folders are closed)
    closed, tool = base / "closed", base / "closed" / "bin" / "python"
    tool.parent.mkdir(parents=True)
    tool.write_text("")
    tool.chmod(0o755)
    closed.chmod(0o700)
    assert unreachable_to_others(tool) == closed
    closed.chmod(0o711)
    assert unreachable_to_others(tool) is None
    tool.chmod(0o750)
    assert unreachable_to_others(tool) == tool


@root_only
async def test_a_tenants_job_cannot_read_nor_signal_another_tenants_job(h, tmp_path, job_root):
    ex = await h.executor(job_users="", job_root=job_root)
    victim = await h.submit(command="echo secret > notes; echo $$ > pid; sleep 60", tenant="vision")
    await h.place(ex, victim)
    await h.wait(victim, "running")
    work = job_root / victim / "attempt-1" / "work-0"
    await h.wait_for(lambda: (work / "pid").exists() and (work / "pid").read_text().strip(), 5, "its pid")
    pid = int((work / "pid").read_text())
    attacker = await h.submit(
        command=f"cat {work}/notes || echo cannot-read; kill -9 {pid} || echo cannot-kill; "
        f"kill -9 -{pid} || echo cannot-kill-group",
        tenant="nlp",
    )
    await h.place(ex, attacker)
    await h.wait(attacker, "succeeded")
    output = (h.data_dir / "jobs" / attacker / "attempt-1" / "replica-0.log").read_text()
    assert "secret" not in output and "cannot-read" in output, output
    assert "Operation not permitted" in output and "cannot-kill" in output and "cannot-kill-group" in output
    assert process_start_time(pid) is not None and (await h.view(victim)).state == "running"
    os.killpg(pid, signal.SIGKILL)
    await h.wait(victim, "failed")
