"""The nats-server configuration `gpuyard up` runs with: one user per role of `gpuyard.shared.bus.permissions`, each
allowed to publish and subscribe only what the table grants, and no anonymous user (a client without
credentials is refused). Credentials are made once and kept in `<data dir>/bus/` (`gpuyard.shared.bus.credentials`);
the configuration itself is written again at every start, from the table and the integrators of single
tenants found there (`<data dir>/bus/integrator-<tenant>.json`, made by `gpuyard admin bus-user --tenant T`:
`add_tenant_integrator`, which also has a running nats-server reload the configuration)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from gpuyard.shared.bus.credentials import BusCredentials, bus_dir, credentials_path, ensure_credentials
from gpuyard.shared.bus.permissions import (
    TENANT_INTEGRATOR_PREFIX,
    Permissions,
    Role,
    permissions,
    tenant_integrator,
    tenant_of_integrator,
    tenant_permissions,
)

log = logging.getLogger(__name__)

CONFIG_FILE = "nats.conf"
UP_CONFIG_FILE = "up.conf"
"""What `gpuyard up` runs nats-server with: the server's name and `include "nats.conf"` (the rest come as flags).
The name is in a file, not a flag: nats-server refuses to reload a configuration whose name differs from the
flag's (SIGHUP would then change nothing)."""
SERVER_NAME = "gpuyard"
PID_FILE = "nats.pid"
"""Where the nats-server of `gpuyard up` writes its pid (in the bus dir), for a reload after a change."""
ROUTE_USER = "route"
"""The user the servers of a clustered bus route to each other as (its credentials in the bus dir)."""
LOCK_FILE = "up.lock"
"""Held by a running `gpuyard up` (in the data dir)."""


def _list(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def _rule(allowed: tuple[str, ...]) -> str:
    """NATS reads an empty allow-list as no restriction at all: nothing allowed is a deny of everything."""
    return f"{{allow: {_list(allowed)}}}" if allowed else '{deny: [">"]}'


def render(credentials: dict[str, BusCredentials], tenants: tuple[str, ...] = ()) -> str:
    """The configuration's authorization block (the server's address and store come as flags): every role's
    user, and the integrator of each of `tenants` (its credentials under `tenant_integrator(tenant)`)."""
    users = []
    grants: list[tuple[str, Permissions]] = [(role.value, permissions(role)) for role in Role]
    grants += [(tenant_integrator(t), tenant_permissions(t)) for t in tenants]
    for name, allowed in grants:
        creds = credentials[name]
        users.append(
            f"    {{user: {json.dumps(creds.user)}, password: {json.dumps(creds.password)}, permissions: {{\n"
            f"      publish: {_rule(allowed.publish)},\n"
            f"      subscribe: {_rule(allowed.subscribe)}\n"
            "    }}"
        )
    return (
        "# Written by `gpuyard up` at every start from shared/bus/permissions.py: edits are lost.\n"
        "# No user without a password: an anonymous client is refused.\n"
        "authorization {\n  users = [\n" + ",\n".join(users) + "\n  ]\n}\n"
    )


def tenant_integrators(data_dir: Path) -> tuple[str, ...]:
    """The tenants that have an integrator: an `integrator-<tenant>.json` in the bus dir, sorted."""
    folder = bus_dir(data_dir)
    if not folder.is_dir():
        return ()
    found = []
    for path in folder.glob(f"{TENANT_INTEGRATOR_PREFIX}*.json"):
        tenant = tenant_of_integrator(path.stem)
        if tenant is None:
            log.warning("%s: not a tenant's integrator (bad tenant name), left out of the bus users", path)
            continue
        found.append(tenant)
    return tuple(sorted(found))


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


@dataclass(frozen=True)
class ClusterMember:
    """One server of a clustered bus: its number (from 1) and every server's route (cluster) address."""

    number: int
    host: str
    route_ports: tuple[int, ...]

    @property
    def route_port(self) -> int:
        return self.route_ports[self.number - 1]


def server_label(number: int) -> str:
    """How the files and names of server `number` are told apart: `` for the first, `-2`, `-3`."""
    return "" if number == 1 else f"-{number}"


def up_config_path(data_dir: Path, number: int = 1) -> Path:
    """The file server `number` starts with: `up.conf`, `up-2.conf`…"""
    return bus_dir(data_dir) / UP_CONFIG_FILE.replace(".conf", f"{server_label(number)}.conf")


def pid_path(data_dir: Path, number: int = 1) -> Path:
    """Where server `number` writes its pid: `nats.pid`, `nats-2.pid`…"""
    return bus_dir(data_dir) / PID_FILE.replace(".pid", f"{server_label(number)}.pid")


def render_cluster(member: ClusterMember, route: BusCredentials) -> str:
    """The `cluster` block of one server: it listens for routes on its own port, and routes to the others, the
    routes authenticated (a route is trusted with every message: none joins without the password)."""
    auth = f"{route.user}:{route.password}@"
    routes = [f"nats://{auth}{member.host}:{p}" for p in member.route_ports if p != member.route_port]
    return (
        "cluster {\n"
        f"  name: {json.dumps(SERVER_NAME)}\n"
        f"  listen: {json.dumps(f'{member.host}:{member.route_port}')}\n"
        f"  authorization {{ user: {json.dumps(route.user)}, password: {json.dumps(route.password)} }}\n"
        f"  routes: {_list(tuple(routes))}\n"
        "}\n"
    )


def write_up_config(data_dir: Path, member: ClusterMember | None = None) -> Path:
    """The users (`write_config`) and the file `gpuyard up` starts nats-server with, which includes them; for a
    server of a clustered bus (`member`), its own name (`gpuyard-2`) and its cluster block."""
    write_config(data_dir)
    number = member.number if member is not None else 1
    name = SERVER_NAME if member is None else f"{SERVER_NAME}-{number}"
    cluster = ""
    if member is not None:
        route = ensure_credentials(data_dir, [ROUTE_USER])[ROUTE_USER]
        cluster = render_cluster(member, route)
    path = up_config_path(data_dir, number)
    _write(
        path,
        "# Written by `gpuyard up` at every start: edits are lost.\n"
        f"server_name: {json.dumps(name)}\n"
        f"include {json.dumps(CONFIG_FILE)}\n" + cluster,
    )
    return path


def write_config(data_dir: Path) -> Path:
    """Make (or reuse) every role's credentials and write the server's configuration, mode 0600, with the
    integrators of single tenants whose credentials are in the bus dir."""
    tenants = tenant_integrators(data_dir)
    credentials = ensure_credentials(
        data_dir, [role.value for role in Role] + [tenant_integrator(t) for t in tenants]
    )
    path = bus_dir(data_dir) / CONFIG_FILE
    _write(path, render(credentials, tenants))
    return path


@dataclass(frozen=True)
class TenantIntegrator:
    tenant: str
    credentials: Path
    config: Path
    reloaded: int | None
    """The pid of the running nats-server that was told to reload its configuration; None: none running (the
    user takes effect at the next `gpuyard up`)."""


def add_tenant_integrator(data_dir: Path, tenant: str) -> TenantIntegrator:
    """Make (or keep) the credentials of `tenant`'s integrator (`<data dir>/bus/integrator-<tenant>.json`,
    0600), write the configuration with it, and have the running nats-server, if any, reload it (SIGHUP).
    ValueError for a tenant name that is not valid."""
    user = tenant_integrator(tenant)
    Path(data_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
    ensure_credentials(data_dir, [user])
    config = write_config(data_dir)
    reloaded = None
    for pid in running_servers(data_dir):  # (every server of a clustered bus)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGHUP)
            reloaded = reloaded or pid
    return TenantIntegrator(tenant, credentials_path(data_dir, user), config, reloaded)


def up_running(data_dir: Path) -> bool:
    """Whether a `gpuyard up` holds the data dir's lock (without taking it for long, and without creating a
    data dir that does not exist)."""
    lock = Path(data_dir) / LOCK_FILE
    try:
        fd = os.open(lock, os.O_WRONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (closing releases a lock taken here)
    return False


def running_servers(data_dir: Path) -> list[int]:
    """The pids of the nats-servers a running `gpuyard up` started on `data_dir` (`running_nats`): the first,
    then those of a clustered bus, as long as their pid files follow."""
    found: list[int] = []
    number = 1
    while pid_path(data_dir, number).exists():
        if (pid := running_nats(data_dir, number)) is not None:
            found.append(pid)
        number += 1
    return found


def running_nats(data_dir: Path, number: int = 1) -> int | None:
    """The pid of the nats-server (`number`: of a clustered bus) a running `gpuyard up` started on `data_dir`:
    the pid its pid file names, when `gpuyard up` holds the lock and that process is a nats-server run with
    this data dir's configuration (a stale pid file naming another process is never signalled)."""
    if not up_running(data_dir):
        return None
    try:
        pid = int(pid_path(data_dir, number).read_text().strip())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    config = str(up_config_path(data_dir, number)).encode()
    if not argv or not Path(argv[0].decode(errors="replace")).name.startswith("nats-server"):
        return None
    return pid if config in argv else None
