"""Bearer tokens and the tenant each one stands for.

File format (JSON or YAML): {"tokens": {"<token>": {"tenant": "vision", "user": "ana", "admin": false}}}.
Inline form (GPUYARD_TOKENS): "token=tenant[:user][:admin],token2=tenant2".
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

import yaml
from pydantic import BaseModel


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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"tokens": {t: p.model_dump() for t, p in tokens.items()}}, indent=2))
    os.chmod(tmp, 0o600)
    tmp.replace(path)
