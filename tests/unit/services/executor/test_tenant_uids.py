"""A tenant's derived uid mixes in its platform's key (`secrets/tenant-uids.key`, made at the executor's first
start): the same tenant name on two platforms of one host gets two uids, and one platform gives a tenant the
same uid at every start. An install that ran jobs before keys keeps deriving them from names alone."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from pathlib import Path

import pytest

from gpuyard.shared.auth.secretfile import SecretFileError
from gpuyard.shared.runtime.jobusers import (
    KEY_FILE,
    NAME_ONLY_FILE,
    UID_SPAN,
    JobUsers,
    derived_number,
    uid_key,
)

BASE = 2_000_000


def users(key: bytes | None) -> JobUsers:
    found = JobUsers.from_setting("", BASE, root=True)
    found.key = key
    return found


def test_the_same_tenant_gets_another_uid_under_another_key_and_the_same_under_one():
    one, other = b"k" * 48, b"q" * 48
    assert users(one).for_tenant("vision") != users(other).for_tenant("vision")
    assert users(one).for_tenant("vision") == users(one).for_tenant("vision")
    assert users(one).for_tenant("vision") != users(one).for_tenant("nlp")
    uid = users(one).for_tenant("vision").uid
    assert BASE <= uid < BASE + UID_SPAN and users(one).for_tenant("vision").gid == uid
    # without a key: the name alone, as before keys (an older install's users keep their uids)
    legacy = int.from_bytes(hashlib.sha256(b"vision").digest()[:8], "big") % UID_SPAN
    assert users(None).for_tenant("vision").uid == BASE + legacy == BASE + derived_number("vision", None)


def test_two_platforms_of_one_host_get_two_keys_and_each_keeps_its_own(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    key_a, said_a = uid_key(first)
    key_b, _ = uid_key(second)
    assert key_a and key_b and key_a != key_b and said_a == ""
    assert users(key_a).for_tenant("vision") != users(key_b).for_tenant("vision")
    path = first / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    (first / "jobs" / "job-1").mkdir(parents=True)  # (jobs ran since: the key is kept)
    assert uid_key(first) == (key_a, "")
    assert users(uid_key(first)[0]).for_tenant("vision") == users(key_a).for_tenant("vision")


def test_an_install_that_ran_jobs_before_keys_keeps_names_alone_until_given_a_key(tmp_path):
    data = tmp_path / "data"
    (data / "jobs" / "0123abcd").mkdir(parents=True)  # a job ran here before this version
    key, said = uid_key(data)
    assert key is None and "derived from their names alone" in said and str(data / KEY_FILE) in said
    assert (data / NAME_ONLY_FILE).exists() and not (data / KEY_FILE).exists()
    os.rmdir(data / "jobs" / "0123abcd")  # (retention swept it: the install remembers)
    assert uid_key(data)[0] is None
    (data / KEY_FILE).write_text("z" * 48 + "\n")
    (data / KEY_FILE).chmod(0o600)
    assert uid_key(data) == (b"z" * 48, "")  # the operator's key wins


def test_another_platforms_jobs_in_a_shared_job_root_do_not_make_an_install_old(tmp_path):
    """The default job root is the host's (/var/lib/gpuyard-jobs): jobs of another platform there say nothing of
    this one, whose data dir is new."""
    key, said = uid_key(tmp_path / "new")
    assert key and said == "" and not (tmp_path / "new" / NAME_ONLY_FILE).exists()


def test_a_key_file_open_to_others_is_refused_with_its_name(tmp_path):
    path = tmp_path / KEY_FILE
    path.parent.mkdir(parents=True)
    path.write_text("x" * 48)
    path.chmod(0o644)
    with pytest.raises(SecretFileError, match="tenant-uids.key is open to other users"):
        uid_key(tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="deriving tenants' users needs a root platform")
async def test_the_executor_derives_its_tenants_uids_with_its_platforms_key(h):
    reachable = Path(tempfile.mkdtemp(prefix="gpuyard-jobs-", dir="/tmp"))
    reachable.chmod(0o711)  # (pytest's own folders are 0700: no job user could pass through them)
    try:
        ex = await h.executor(job_users="", job_root=reachable / "jobs")
    finally:
        shutil.rmtree(reachable)
    key = (h.data_dir / KEY_FILE).read_bytes().strip()
    assert ex.backend.job_users.key == key
    assert ex.backend.job_users.for_tenant("vision").uid == BASE + derived_number("vision", key)
