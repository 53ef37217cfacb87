"""The platforms this CLI knows, one *context* each, as kubectl's and docker's: the API's URL, the admin token
`gpuyard up` saved for it and the data directory it runs on, kept in `<config dir>/config.json` (mode 0600, its
folder 0700). One context is current; `--context NAME` or GPUYARD_CONTEXT picks another for one command.
`gpuyard up` adds or updates the context of its data directory and makes it current, so a trial platform on
another data directory never takes the place of the first one.

    {"current": "default",
     "contexts": {"default": {"server": "http://127.0.0.1:8080", "token": "gy_…",
                              "data_dir": "/home/ana/.local/share/gpuyard"},
                  "trial": {"server": "http://127.0.0.1:8081", "token": "gy_…", "data_dir": "/tmp/trial"}},
     "server": "http://127.0.0.1:8080", "token": "gy_…"}

The top-level `server` and `token` repeat the current context's: they are all that config.json held before
there were contexts, and scripts and older CLIs read them. A file that holds only those two is read as one
context and written back in the form above at once (`migrated`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from gpuyard.shared.runtime.paths import PRIVATE_FILE, private_dir, write_private
from gpuyard.shared.settings.client import ClientSettings
from gpuyard.shared.settings.common import default_data_dir

CONFIG_FILE = "config.json"
DEFAULT_NAME = "default"
"""The context of the default data directory (and of an older config.json whose token that platform takes)."""
LIST_THEM = "`gpuyard context ls` lists them"


class ContextError(Exception):
    """A context that cannot be used, as one line."""


@dataclass(frozen=True)
class Context:
    name: str
    server: str
    token: str = ""
    data_dir: str = ""
    """The data directory of the `gpuyard up` that saved it; empty: unknown (an older config.json's)."""


@dataclass
class Contexts:
    entries: dict[str, Context] = field(default_factory=dict)
    current: str | None = None

    def pick(self, name: str | None = None) -> Context | None:
        """The context named (ContextError when there is none of that name), else the current one, if any."""
        if name:
            if name not in self.entries:
                raise ContextError(f"no context {name!r}: {LIST_THEM}")
            return self.entries[name]
        return self.entries.get(self.current or "")

    def of_data_dir(self, data_dir: Path) -> Context | None:
        return next((c for c in self.entries.values() if c.data_dir == str(data_dir)), None)

    def saved_tokens(self, data_dir: Path) -> list[str]:
        """Every token saved, that of `data_dir`'s context first: those `gpuyard up` tries on its tokens file
        (another context's may be this platform's too: a restored backup, an older config.json's)."""
        own = self.of_data_dir(data_dir)
        tokens = [own.token] if own and own.token else []
        return tokens + [c.token for c in self.entries.values() if c.token and c.token not in tokens]

    def name_for(self, data_dir: Path) -> str:
        """A new context's name for `data_dir`: `default` for the default data directory, else the folder's
        name (`-2`, `-3`… after it when another platform has that name)."""
        base = DEFAULT_NAME if data_dir == _default_data_dir() else _slug(data_dir.name)
        name, n = base, 1
        while name in self.entries:
            n += 1
            name = f"{base}-{n}"
        return name

    def record(self, data_dir: Path, server: str, token: str) -> Context:
        """`gpuyard up`'s: `data_dir`'s context now names `server` and `token`, and is current. It is the
        context saved for `data_dir`, else one saved without a data directory (an older config.json's) whose
        token this platform took, else a new one."""
        found = self.of_data_dir(data_dir) or next(
            (c for c in self.entries.values() if not c.data_dir and c.token == token), None
        )
        name = found.name if found else self.name_for(data_dir)
        self.entries[name] = Context(name, server, token, str(data_dir))
        self.current = name
        return self.entries[name]

    def to_json(self) -> dict:
        chosen = self.pick()
        mirror = {"server": chosen.server, "token": chosen.token} if chosen else {}
        entries = {
            name: {k: v for k, v in asdict(c).items() if k != "name"} for name, c in self.entries.items()
        }
        return {"current": self.current, "contexts": entries, **mirror}

    @classmethod
    def from_json(cls, data: object) -> Contexts:
        if not isinstance(data, dict):
            return cls()
        if "contexts" not in data:
            return _migrated(data)
        entries = {}
        for name, c in (data.get("contexts") or {}).items():
            if isinstance(c, dict) and isinstance(c.get("server"), str):
                entries[name] = Context(
                    name, c["server"], str(c.get("token") or ""), str(c.get("data_dir") or "")
                )
        current = data.get("current")
        return cls(entries, current if current in entries else None)


def _default_data_dir() -> Path:
    return default_data_dir().expanduser().resolve()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip(".-") or "platform"


def _migrated(data: dict) -> Contexts:
    """An older config.json (`{"server": …, "token": …}`, one platform) as one context: the default data
    directory's (`default`) when its tokens file takes the token, else one of unknown data directory named
    after its server, which the `gpuyard up` of the platform that takes its token makes its own."""
    server, token = data.get("server"), str(data.get("token") or "")
    if not isinstance(server, str) or not server:
        return Contexts()
    data_dir = _default_data_dir() if token and _takes(_default_data_dir(), token) else None
    name = DEFAULT_NAME if data_dir else _slug(urlsplit(server).netloc or server)
    return Contexts({name: Context(name, server, token, str(data_dir or ""))}, name)


def _takes(data_dir: Path, token: str) -> bool:
    """Whether the tokens file of `data_dir` takes `token` (read here only to name an older config's context)."""
    from gpuyard.shared.auth.tokens import TokenRefused, Tokens

    path = data_dir / "tokens.json"
    if not path.exists():
        return False
    try:
        Tokens(path).authenticate(token)
    except TokenRefused:
        return False
    return True


def config_dir() -> Path:
    return ClientSettings().config_dir


def config_path(folder: Path | None = None) -> Path:
    return (folder or config_dir()) / CONFIG_FILE


def _read(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):  # none yet, or not JSON: no context (the next `gpuyard up` writes one)
        return None


def load(folder: Path | None = None) -> Contexts:
    """The contexts saved; an older config.json is rewritten in the new form on this first read."""
    path = config_path(folder)
    data = _read(path)
    if isinstance(data, dict) and "contexts" not in data and data.get("server"):
        with contextlib.suppress(OSError), editing(folder) as contexts:  # (re-read under the lock)
            return contexts
    return Contexts.from_json(data)


@contextlib.contextmanager
def editing(folder: Path | None = None) -> Iterator[Contexts]:
    """The contexts, locked against other writers (two `gpuyard up` starting at once), written back whole
    (0600, replaced atomically) when the block ends without an error."""
    path = config_path(folder)
    private_dir(path.parent)
    lock = os.open(path.with_name(CONFIG_FILE + ".lock"), os.O_RDWR | os.O_CREAT, PRIVATE_FILE)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        contexts = Contexts.from_json(_read(path))
        yield contexts
        write_private(path, json.dumps(contexts.to_json(), indent=2) + "\n")
    finally:
        os.close(lock)
