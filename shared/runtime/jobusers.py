"""Which local user runs a tenant's jobs: never the platform's own when it runs as root.

`GPUYARD_JOB_USERS` maps tenants to users: `vision=gpu-vision,nlp=1500:1500,*=nobody` (a user name, or
uid[:gid]; `*` for every tenant not named; `platform`: the platform's own user, which must be asked for by
name, e.g. `*=platform` on a machine whose only tenant is its owner, or in tests). Left empty on a root
platform, each tenant runs as a user of its own that needs no account: uid = gid = `GPUYARD_JOB_UID_BASE` + a
number derived from the tenant's name and the platform's key of uids (`secrets/tenant-uids.key` in the data
dir, made at the executor's first start: `uid_key`), so that a tenant of the same name on another platform of
the same host gets another uid, while every executor that has the same key (copy the file to every node) gives
a tenant the same one. A job then runs with that uid and gid and no supplementary group: it cannot read the
platform's files (0600 / 0700, owned by the platform), another tenant's working directory (0700, owned by that
tenant's user) or logs (written by the executor, 0600), and cannot signal another tenant's processes.

A platform that is not root cannot switch users: its jobs run with its own rights (it says so at start), and
a mapping in `GPUYARD_JOB_USERS` is refused.

An install that ran jobs before uids were keyed keeps deriving them from names alone, so that its tenants' files
keep their owners: its first start with keys finds job folders already there (`<data dir>/jobs`), writes
`secrets/tenant-uids.name-only` to remember it, and says at each start that same-named tenants of two
platforms on the host share a uid. Such an install moves to keyed uids when its operator puts a key in
`secrets/tenant-uids.key` (every tenant then gets a new uid); a new install whose operator wants the old
scheme writes the name-only file before its first start.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from gpuyard.shared.auth.secretfile import ensure_secret
from gpuyard.shared.runtime.paths import write_private

UID_SPAN = 1 << 30
"""Numbers a tenant's derived uid is taken from, above the base (two of 100 tenants share one with a chance of
about 1 in 200,000); base + span stays below 2^31."""
KEY_FILE = "secrets/tenant-uids.key"
"""In the data dir: the platform's key of derived uids (mode 0600, made once)."""
NAME_ONLY_FILE = "secrets/tenant-uids.name-only"
"""In the data dir: uids derive from tenants' names alone (an install from before keys, see above)."""
KEY_WHAT = "key of tenants' uids"
NAME_ONLY = (
    "tenants' uids are derived from their names alone ({marker}: jobs ran on this data dir before uids were "
    "keyed, and their files keep their owners): a tenant of the same name on another platform of this host "
    "gets the same uid. Put a key in {key} to derive them with this platform's (every tenant gets a new uid)"
)
SHARED_RIGHTS = (
    "jobs run as this platform's own user ({user}) and share its rights: they can read its data directory "
    "(tokens, event store, other jobs' logs). Run the platform as root to run jobs as unprivileged users."
)


@dataclass(frozen=True)
class JobUser:
    uid: int
    gid: int
    name: str
    """The account's name, or `tenant-<uid>` for a derived user without an account."""


class JobUsers:
    def __init__(
        self, mapping: dict[str, JobUser | None], *, derive_base: int | None, key: bytes | None = None
    ):
        self.mapping = mapping
        self.derive_base = derive_base
        self.key = key
        """The platform's key of derived uids (`uid_key`); None: derived from names alone."""

    @classmethod
    def from_setting(cls, text: str, uid_base: int, *, root: bool | None = None) -> JobUsers:
        """Parse and resolve the setting; ValueError with a line for the operator when it cannot be used."""
        root = os.geteuid() == 0 if root is None else root
        mapping = {}
        for entry in filter(None, (part.strip() for part in text.split(","))):
            tenant, sep, user = (s.strip() for s in entry.partition("="))
            if not sep or not tenant or not user:
                raise ValueError(f"job_users: {entry!r} is not tenant=user (or *=user)")
            mapping[tenant] = None if user == "platform" else resolve(user)
        if any(mapping.values()) and not root:
            raise ValueError("job_users: only a platform running as root can run jobs as other users")
        return cls(mapping, derive_base=uid_base if root and "*" not in mapping else None)

    def for_tenant(self, tenant: str) -> JobUser | None:
        """The user a tenant's jobs run as; None: the platform's own (it is not root)."""
        if tenant in self.mapping or "*" in self.mapping:
            return self.mapping.get(tenant, self.mapping.get("*"))
        user = None
        if self.derive_base is not None:
            uid = self.derive_base + derived_number(tenant, self.key)
            user = JobUser(uid, uid, f"tenant-{uid}")
        return user

    @property
    def derives(self) -> bool:
        """Whether some tenants get a derived uid (no account, no mapping)."""
        return self.derive_base is not None

    @property
    def switches(self) -> bool:
        """Whether some jobs run as another user than the platform's."""
        return self.derive_base is not None or any(self.mapping.values())

    @property
    def shared_rights(self) -> bool:
        """Whether some jobs run with the platform's own rights."""
        if "*" in self.mapping:
            return self.mapping["*"] is None or None in self.mapping.values()
        return self.derive_base is None or None in self.mapping.values()


def derived_number(tenant: str, key: bytes | None) -> int:
    """The tenant's number above the uid base: HMAC-SHA256 of its name under the platform's key, or, without
    one, SHA-256 of its name alone (first 8 bytes, modulo UID_SPAN)."""
    name = tenant.encode()
    digest = hmac.digest(key, name, "sha256") if key is not None else hashlib.sha256(name).digest()
    return int.from_bytes(digest[:8], "big") % UID_SPAN


def uid_key(data_dir: Path) -> tuple[bytes | None, str]:
    """The platform's key of derived uids, and a line for the node's log when there is none: the key file's,
    made (random, 0600) on a new install; None on an install that ran jobs before keys (its data dir's `jobs/`
    holds some: the job root is no witness, other platforms of the host may share it). SecretFileError for a
    key file that cannot be used."""
    key, marker = Path(data_dir) / KEY_FILE, Path(data_dir) / NAME_ONLY_FILE
    if not key.exists():
        before = marker.exists() or ran_jobs(Path(data_dir) / "jobs")
        # (the key again: another executor of the node may have made it meanwhile, and then a job)
        if before and not key.exists():
            if not marker.exists():
                write_private(marker, "tenants' uids are derived from their names alone (docs/executor.md)\n")
            return None, NAME_ONLY.format(marker=marker, key=key)
    return ensure_secret(key, KEY_WHAT), ""


def ran_jobs(folder: Path) -> bool:
    """Whether the folder holds something (jobs ran here before)."""
    try:
        with os.scandir(folder) as entries:
            return next(entries, None) is not None
    except OSError:
        return False


def resolve(user: str) -> JobUser:
    """A user name (its account's uid and primary gid) or uid[:gid]; never root."""
    if user.replace(":", "").isdigit() and user.count(":") <= 1:
        uid_text, _, gid_text = user.partition(":")
        uid = int(uid_text)
        gid = int(gid_text) if gid_text else uid
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = f"uid-{uid}"
        found = JobUser(uid, gid, name)
    else:
        try:
            account = pwd.getpwnam(user)
        except KeyError:
            raise ValueError(f"job_users: no user {user!r} on this machine") from None
        found = JobUser(account.pw_uid, account.pw_gid, account.pw_name)
    if found.uid == 0 or found.gid == 0:
        raise ValueError(f"job_users: {user!r} is root; a job never runs as root")
    return found


def platform_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return f"uid {os.geteuid()}"
