"""One node's job environments: the interpreters it offers, the environments it holds and which running
attempts use them, their builds, their removal and the retention sweep (the local backend holds one)."""

from __future__ import annotations

import asyncio
import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpuyard.services.executor.environments.builder import (
    META,
    BuildFailed,
    Built,
    EnvironmentBuilder,
    Output,
)
from gpuyard.services.executor.environments.catalog import (
    clear_leftovers,
    delete_set_aside,
    held_environments,
    put_back,
    set_aside,
    unused_since,
)
from gpuyard.services.executor.environments.inuse import Alive, InUseMarks, Replica
from gpuyard.services.executor.environments.pythons import default_python, find_pythons
from gpuyard.shared.contracts.events.nodes import MAX_ANNOUNCED_ENVIRONMENTS, NodeEnvironment
from gpuyard.shared.contracts.jobspec import EnvironmentSpec, packages_summary
from gpuyard.shared.contracts.units import format_size
from gpuyard.shared.settings.environments import EnvironmentSettings

log = logging.getLogger(__name__)

ENVIRONMENTS = "environments"


def environments_root(
    settings: EnvironmentSettings, data_dir: Path, job_root: Path, *, switches: bool
) -> Path:
    """The setting, else environments/ in the data dir, or in the job root where jobs run as other users (the
    data dir is closed to them)."""
    if settings.environment_root is not None:
        return Path(settings.environment_root)
    return (job_root if switches else data_dir) / ENVIRONMENTS


class InUse(Exception):
    """The environment is used by a running job: it is not removed."""


class NodeEnvironments:
    def __init__(
        self,
        root: Path,
        settings: EnvironmentSettings,
        node: str,
        *,
        alive: Alive = lambda *_: True,
        uv: str = "",
        shared: bool = True,
    ):
        """`alive`: whether a replica may still run on the node (its pid file is there), for marks of use left
        by an executor that stopped (`InUseMarks`); `shared`: jobs run as other users, who must reach the
        environments (else the root is the platform's alone, as the data dir it is in)."""
        self.root = root
        self.mode = 0o755 if shared else 0o700
        self.settings = settings
        self.node = node
        self.pythons: dict[str, str] = {}
        self.builder = EnvironmentBuilder(root, settings, self.pythons, uv=uv)
        self.marks = InUseMarks(root, alive)
        """Which running replicas use which environment (seen by every executor process of the node)."""

    def open(self) -> None:
        """Find the interpreters, make the root (searchable by the jobs' users where they are others), clear what
        a dead executor left."""
        self.pythons.update(find_pythons(self.settings.environment_pythons_path))
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, self.mode)
        clear_leftovers(self.root)
        offered = ", ".join(sorted(self.pythons)) or "none (no system python3.N found)"
        log.info("job environments in %s; python versions offered: %s", self.root, offered)

    def python_of(self, env: EnvironmentSpec) -> str:
        """The Python version the environment gets here; BuildFailed when the node offers none of it."""
        wanted = env.python or default_python(self.pythons)
        if wanted is None or wanted not in self.pythons:
            offered = ", ".join(sorted(self.pythons)) or "none"
            asked = f"python {wanted}" if wanted else "a python"
            raise BuildFailed(
                f"node {self.node} offers no {asked} for job environments (it offers: {offered})"
            )
        return wanted

    async def ensure(self, env: EnvironmentSpec, user: Replica, output: Output) -> Built:
        """The environment for one replica (built, or reused), marked as used by it until `release`; one removed
        between its build and its mark is built again."""
        python = self.python_of(env)
        built = await self.builder.ensure(env, python, output)
        self.marks.mark(built.key, user)
        if not (
            built.path / META
        ).is_file():  # (set aside by a removal meanwhile: marked first, then looked for)
            self.marks.unmark(user)
            built = await self.builder.ensure(env, python, output)
            self.marks.mark(built.key, user)
        return built

    def release(self, user: Replica) -> None:
        self.marks.unmark(user)

    def announced(self) -> list[NodeEnvironment]:
        """What the heartbeat says the node holds (the most recently used first), read from the root: what any
        executor process of the node built or used."""
        used = self.marks.used()
        held = held_environments(self.root)
        return [
            NodeEnvironment(
                key=e.key,
                python=e.python,
                packages=packages_summary(e.pip),
                package_count=len(e.pip),
                size_bytes=e.size_bytes,
                last_used=e.last_used,
                in_use=used.get(e.key, 0),
            )
            for e in held[:MAX_ANNOUNCED_ENVIRONMENTS]
        ]

    async def remove(self, key: str) -> int | None:
        """Remove one environment (InUse while a running replica uses it); the bytes freed, None: none here."""
        if using := self.marks.count(key):
            raise InUse(f"environment {key} is used by {using} running replica(s) on {self.node}")
        async with self.builder.locks[key]:  # (never under a build of the same key)
            aside = await asyncio.to_thread(set_aside, self.root, key)
            if aside is not None and (using := self.marks.count(key)):  # (a job started in it meanwhile)
                await asyncio.to_thread(put_back, self.root, key, aside[0])
                raise InUse(f"environment {key} is used by {using} running replica(s) on {self.node}")
            if aside is not None:
                await asyncio.to_thread(delete_set_aside, aside[0])
        return aside[1] if aside is not None else None

    async def sweep(self, now: datetime | None = None) -> list[tuple[str, int]]:
        """Remove the environments unused for the retention (none when it is 0): (key, bytes freed) each."""
        keep = self.settings.environment_retention
        if not keep:
            return []
        before = (now or datetime.now(UTC)) - timedelta(seconds=keep)
        held = await asyncio.to_thread(held_environments, self.root)
        removed = []
        for env in unused_since(held, before, set(self.marks.used())):
            try:
                freed = await self.remove(env.key)
            except InUse:
                continue
            if freed is not None:
                removed.append((env.key, freed))
                log.info(
                    "removed environment %s (python %s, %s), unused since %s: %s freed",
                    env.key,
                    env.python,
                    packages_summary(env.pip),
                    env.last_used.isoformat(timespec="seconds"),
                    format_size(freed),
                )
        return removed
