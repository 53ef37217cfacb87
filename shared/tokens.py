"""Bearer tokens and the tenant each one stands for.

File format (JSON or YAML): {"tokens": {"<token>": {"tenant": "vision", "user": "ana", "admin": false}}}.
Inline form (GPUYARD_TOKENS): "token=tenant[:user][:admin],token2=tenant2".
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

import yaml
from pydantic import BaseModel

from shared.paths import private_dir


class Principal(BaseModel):
    tenant: str
    user: str = ""
    admin: bool = False

    @property
    def name(self) -> str:
        return self.user or self.tenant


def load_tokens(path: Path | None, inline: str = "") -> dict[str, Principal]:
    tokens: dict[str, Principal] = {}
    if path is not None:
        data = yaml.safe_load(Path(path).read_text()) or {}
        for token, who in (data.get("tokens") or {}).items():
            tokens[str(token)] = Principal.model_validate(who)
    for item in filter(None, (part.strip() for part in inline.split(","))):
        token, _, rest = item.partition("=")
        tenant, user, admin = ([*rest.split(":"), "", ""])[:3]
        if not token or not tenant:
            raise ValueError(f"bad inline token {item!r}: write token=tenant[:user][:admin]")
        tokens[token] = Principal(tenant=tenant, user=user, admin=admin == "admin")
    return tokens


def new_token() -> str:
    return "gy_" + secrets.token_urlsafe(24)


def write_tokens(path: Path, tokens: dict[str, Principal]) -> None:
    private_dir(path.parent)
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # one left by an earlier try may have other permissions
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others, even briefly
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps({"tokens": {t: p.model_dump() for t, p in tokens.items()}}, indent=2))
    tmp.replace(path)
