"""The settings of jobs' own Python environments (`environment: {pip: [...]}`, docs/environments.md), which the
executor builds with uv on its node: where they live, where packages come from, how long an unused one is kept.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from gpuyard.shared.settings.common import Duration, written
from gpuyard.shared.settings.storage import StorageSettings


class EnvironmentSettings(StorageSettings):
    """Read by the executor (its local backend builds the environments)."""

    environment_root: Path | None = Field(
        None,
        description="Where a node keeps the environments it built, one folder per content hash "
        "(`<root>/<key>/`). Default: environments/ in the data dir; where jobs run as other users (a root "
        "platform), environments/ in the job root, which they can reach.",
    )
    environment_index_url: str = Field(
        "",
        description="The package index uv installs from (empty: uv's default, PyPI). Part of each "
        "environment's key: another index builds another environment.",
    )
    environment_find_links: str = Field(
        "",
        description="Folders or URLs of wheels uv also looks in, comma-separated (`--find-links`). Part of "
        "each environment's key.",
    )
    environment_offline: bool = Field(
        False,
        description="Build with what the find-links and uv's cache hold, never reaching an index "
        "(`--offline --no-index`).",
    )
    environment_source_builds: bool = Field(
        False,
        description="Let uv build packages that have no wheel from their source (their build scripts then "
        "run with the platform's rights on the node); off: wheels only (`--no-build`).",
    )
    environment_pythons_path: str = Field(
        "/usr/local/bin:/usr/bin",
        description="Where the node looks for the Python interpreters environments are made from "
        "(`python3.N`, colon-separated): system interpreters that jobs' users can run. Each version found "
        "once at the executor's start is announced with the node's heartbeat.",
    )
    environment_build_timeout: Duration = Field(
        written("30m"),
        gt=0,
        description="Longest build of one environment; past it the build is stopped and its job fails "
        "(`environment_failed`).",
    )
    environment_retention: Duration = Field(
        written("14d"),
        ge=0,
        description="An environment no job has used for this long is removed by the executor's retention "
        "sweep (0: kept until `gpuyard envs rm`).",
    )

    def builder_settings(self) -> tuple[str, ...]:
        """What of these settings changes what a build installs: part of each environment's key."""
        links = tuple(link.strip() for link in self.environment_find_links.split(",") if link.strip())
        return (self.environment_index_url, *links)
