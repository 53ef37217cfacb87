"""The nats-server configuration `gpuyard up` runs with: one user per role of `shared.buspermissions`, each
allowed to publish and subscribe only what the table grants, and no anonymous user (a client without
credentials is refused). Credentials are made once and kept in `<data dir>/bus/` (`shared.buscredentials`);
the configuration itself is written again at every start, from the table."""

from __future__ import annotations

import json
import os
from pathlib import Path

from shared.buscredentials import BusCredentials, bus_dir, ensure_credentials
from shared.buspermissions import Role, permissions

CONFIG_FILE = "nats.conf"


def _list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def _rule(allowed: tuple[str, ...]) -> str:
    """NATS reads an empty allow-list as no restriction at all: nothing allowed is a deny of everything."""
    return f"{{allow: {_list(allowed)}}}" if allowed else '{deny: [">"]}'


def render(credentials: dict[str, BusCredentials]) -> str:
    """The configuration's authorization block (the server's address and store come as flags)."""
    users = []
    for role in Role:
        creds = credentials[role.value]
        allowed = permissions(role)
        users.append(
            f"    {{user: {json.dumps(creds.user)}, password: {json.dumps(creds.password)}, permissions: {{\n"
            f"      publish: {_rule(allowed.publish)},\n"
            f"      subscribe: {_rule(allowed.subscribe)}\n"
            "    }}"
        )
    return (
        "# Written by `gpuyard up` at every start from shared/buspermissions.py: edits are lost.\n"
        "# No user without a password: an anonymous client is refused.\n"
        "authorization {\n  users = [\n" + ",\n".join(users) + "\n  ]\n}\n"
    )


def write_config(data_dir: Path) -> Path:
    """Make (or reuse) every role's credentials and write the server's configuration, mode 0600."""
    credentials = ensure_credentials(data_dir, [role.value for role in Role])
    path = bus_dir(data_dir) / CONFIG_FILE
    tmp = path.with_name(f".{CONFIG_FILE}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(render(credentials))
    os.replace(tmp, path)
    return path
