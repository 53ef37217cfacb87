"""Bearer tokens and the tenant each one stands for, kept hashed in a tokens file that every reader re-reads
when it changes (a revocation or an expiry counts on the next request, on every submit instance).

File format (JSON or YAML):
  {"tokens": {"sha256:<hex of the token's SHA-256>": {"id": "...", "tenant": "vision", "user": "ana",
   "admin": false, "created": "...", "expires": null}}}
A key without the "sha256:" prefix is a plain token (the format before tokens were hashed, or one written by
hand): it counts as its hash, and the next write stores its hash instead. The admin token `gpuyard up` keeps for
its data dir's CLI is marked `"minted_by": "gpuyard up"`: one at a time (`Tokens.keep_up_admin`).
Inline form (GPUYARD_TOKENS): "token=tenant[:user][:admin],token2=tenant2"; those are fixed by the settings.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path

import yaml
from pydantic import BaseModel, ValidationError

from gpuyard.shared.runtime.paths import PRIVATE_FILE, private_dir

log = logging.getLogger(__name__)

HASH_PREFIX = "sha256:"
UNKNOWN = "unknown or revoked token"
UP_MINTED = "gpuyard up"
"""`TokenEntry.minted_by` of the admin token that `gpuyard up` keeps for its data dir's CLI."""


class Principal(BaseModel):
    tenant: str
    user: str = ""
    admin: bool = False

    @property
    def name(self) -> str:
        return self.user or self.tenant


def may_see(principal: Principal, tenant: str) -> bool:
    """Whether `principal` may see and act for `tenant`'s jobs and models: its own tenant's, or an admin."""
    return principal.admin or principal.tenant == tenant


class TokenEntry(Principal):
    """One token as it is stored: who it stands for, never the token."""

    id: str
    created: datetime | None = None
    expires: datetime | None = None
    inline: bool = False
    """Set by GPUYARD_TOKENS (the settings), not in the file: not revocable here."""
    minted_by: str = ""
    """`gpuyard up` (UP_MINTED) for the admin token it keeps for the CLI; empty for every other token."""

    def expired(self, now: datetime) -> bool:
        return self.expires is not None and now >= self.expires

    def principal(self) -> Principal:
        return Principal(tenant=self.tenant, user=self.user, admin=self.admin)


class TokenRefused(Exception):
    """A token that stands for nobody now; the message says why (never the token)."""


class TokensFixed(Exception):
    """Tokens cannot be created or revoked here: no tokens file is configured, or it cannot be written (a
    read-only mount, such as a Kubernetes Secret)."""


def token_hash(token: str) -> str:
    return HASH_PREFIX + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


def _legacy_id(key_hash: str) -> str:
    """A stable id for an entry stored without one (derived from its hash, revealing nothing of it)."""
    return "tok_" + hashlib.sha256(("id:" + key_hash).encode()).hexdigest()[:12]


def new_token() -> str:
    return "gy_" + secrets.token_urlsafe(24)


def new_id() -> str:
    return "tok_" + secrets.token_hex(6)


def parse_tokens(data: dict | None) -> dict[str, TokenEntry]:
    """The table of a tokens file's content, keyed by token hash."""
    table: dict[str, TokenEntry] = {}
    for key, who in ((data or {}).get("tokens") or {}).items():
        key = str(key)
        key_hash = key if key.startswith(HASH_PREFIX) else token_hash(key)
        table[key_hash] = TokenEntry.model_validate({"id": _legacy_id(key_hash), **(who or {})})
    return table


def parse_inline(inline: str) -> dict[str, TokenEntry]:
    table: dict[str, TokenEntry] = {}
    for item in filter(None, (part.strip() for part in inline.split(","))):
        token, _, rest = item.partition("=")
        tenant, user, admin = ([*rest.split(":"), "", ""])[:3]
        if not token or not tenant:
            raise ValueError(f"bad inline token {item!r}: write token=tenant[:user][:admin]")
        key_hash = token_hash(token)
        table[key_hash] = TokenEntry(
            id=_legacy_id(key_hash), tenant=tenant, user=user, admin=admin == "admin", inline=True
        )
    return table


def read_tokens_file(path: Path) -> dict[str, TokenEntry]:
    """Raises OSError or ValueError (a file that is not YAML/JSON, or an entry that is not valid)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as exc:  # its position only: the message would quote the line, maybe a plain token
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path} is not valid YAML/JSON{where}") from None
    try:
        return parse_tokens(data)
    except (ValidationError, AttributeError) as exc:
        raise ValueError(f"{path} is not a valid tokens file: {exc}") from None


def write_tokens_file(path: Path, table: dict[str, TokenEntry]) -> None:
    """Atomically (a 0600 temporary file renamed over it): a reader sees the old table or the new one. Each
    write's mtime is later than the last one's, to the nanosecond (the clock of file times is coarse), so a
    reader's (inode, mtime, size) check sees every change."""
    private_dir(path.parent)
    tmp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # one left by an earlier try may have other permissions
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)  # never readable by others
    stored = {h: _stored(e) for h, e in table.items() if not e.inline}
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"tokens": stored}, indent=2))
    with contextlib.suppress(FileNotFoundError):
        mtime = max(time.time_ns(), os.stat(path).st_mtime_ns + 1)
        os.utime(tmp, ns=(mtime, mtime))
    tmp.replace(path)


def _stored(entry: TokenEntry) -> dict:
    """An entry as the file keeps it: `minted_by` only where it is set (the one token of `gpuyard up`)."""
    exclude = {"inline"} if entry.minted_by else {"inline", "minted_by"}
    return entry.model_dump(mode="json", exclude=exclude)


class Tokens:
    """The tokens of a file (re-read when its inode, mtime or size changed: a stat per lookup) and of the
    settings' inline form. `authenticate` is the one lookup, for the routes and the submit fast path."""

    def __init__(self, path: Path | None, inline: str = ""):
        self.path = Path(path) if path is not None else None
        self.inline = parse_inline(inline)
        self._seen: tuple[int, int, int] | None = None
        self._table: dict[str, TokenEntry] = {}

    def check(self) -> dict[str, TokenEntry]:
        """The whole table, raising OSError or ValueError when the file cannot be read (start-up checks)."""
        file = read_tokens_file(self.path) if self.path is not None else {}
        return {**file, **self.inline}

    def table(self) -> dict[str, TokenEntry]:
        if self.path is None:
            return self.inline
        try:
            st = os.stat(self.path)
            seen = (st.st_ino, st.st_mtime_ns, st.st_size)
            if seen != self._seen:
                self._table, self._seen = read_tokens_file(self.path), seen
        except (OSError, ValueError) as exc:  # refuse every file token rather than keep revoked ones
            if self._seen != (0, 0, -1):
                log.error("tokens file unusable, its tokens are refused until it is fixed: %s", exc)
            self._table, self._seen = {}, (0, 0, -1)
        return {**self._table, **self.inline}

    def authenticate(self, token: str, now: datetime | None = None) -> Principal:
        return self.valid(self.table().get(token_hash(token)), now).principal()

    def entry(self, token: str, now: datetime | None = None) -> TokenEntry:
        """The entry of a valid token (what a dashboard session keeps: its id)."""
        return self.valid(self.table().get(token_hash(token)), now)

    def authenticate_id(self, token_id: str, now: datetime | None = None) -> Principal:
        """The principal of the valid token whose id is `token_id` (a dashboard session's): refused once the
        token is revoked or expired."""
        return self.valid(next((e for e in self.table().values() if e.id == token_id), None), now).principal()

    @staticmethod
    def valid(entry: TokenEntry | None, now: datetime | None) -> TokenEntry:
        if entry is None:
            raise TokenRefused(UNKNOWN)
        if entry.expired(now or datetime.now(UTC)):
            raise TokenRefused(f"token {entry.id} expired at {entry.expires.isoformat()}")  # type: ignore[union-attr]
        return entry

    def entries(self) -> list[TokenEntry]:
        return sorted(
            self.table().values(), key=lambda e: (e.created or datetime.min.replace(tzinfo=UTC), e.id)
        )

    @contextlib.contextmanager
    def _editing(self) -> Iterator[dict[str, TokenEntry]]:
        """The file's table, locked against other writers, written back (hashed) when the block ends."""
        if self.path is None:
            raise TokensFixed(
                "no tokens file is configured (GPUYARD_TOKENS_FILE): tokens are fixed by the settings"
            )
        try:
            private_dir(self.path.parent)
            lock_fd = os.open(
                self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, PRIVATE_FILE
            )
        except OSError as exc:
            raise TokensFixed(
                f"the tokens file cannot be written here ({exc.strerror}): change it at its source"
            ) from None
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                table = read_tokens_file(self.path) if self.path.exists() else {}
            except (OSError, ValueError) as exc:
                raise TokensFixed(f"the tokens file cannot be read, fix it first: {exc}") from None
            yield table
            write_tokens_file(self.path, table)
        finally:
            os.close(lock_fd)

    def create(
        self, tenant: str, user: str = "", admin: bool = False, expires: datetime | None = None
    ) -> tuple[str, TokenEntry]:
        """A new token (returned once: only its hash is kept) and its entry."""
        token = new_token()
        entry = TokenEntry(
            id=new_id(), tenant=tenant, user=user, admin=admin, created=datetime.now(UTC), expires=expires
        )
        with self._editing() as table:
            table[token_hash(token)] = entry
        return token, entry

    def revoke(self, token_id: str) -> TokenEntry | None:
        """The entry revoked; None when no entry of the file has that id."""
        with self._editing() as table:
            key = next((h for h, e in table.items() if e.id == token_id), None)
            return table.pop(key) if key is not None else None

    def keep_up_admin(self, saved: Sequence[str]) -> tuple[str, bool]:
        """The admin token `gpuyard up` keeps for this file's platform, and whether it is new: the first of
        `saved` (the tokens the CLI saved, this data dir's first) that the file takes as a valid admin's, else a
        new one (the file keeps hashes: a token it holds cannot be shown again). Either way it is the one token
        marked UP_MINTED: any other so marked (one whose saved copy was lost, expired or revoked) is revoked, so
        that restarts never pile up admin tokens that never expire."""
        now = datetime.now(UTC)
        with self._editing() as table:
            kept = next((t for t in saved if t and self._admin_now(table.get(token_hash(t)), now)), None)
            token = kept or new_token()
            key = token_hash(token)
            entry = table.get(key) or TokenEntry(
                id=new_id(), tenant="default", user="admin", admin=True, created=now
            )
            for other in [h for h, e in table.items() if e.minted_by == UP_MINTED and h != key]:
                log.info("revoking token %s, an earlier admin token of `gpuyard up`", table[other].id)
                del table[other]
            table[key] = entry.model_copy(update={"minted_by": UP_MINTED})
        return token, kept is None

    @staticmethod
    def _admin_now(entry: TokenEntry | None, now: datetime) -> bool:
        return entry is not None and entry.admin and not entry.expired(now)
