"""The settings tables of docs/operations.md, made from the settings models: each setting's variable, flag,
default and description, as the models declare them.

`python -m gpuyard.docsgen.settings` rewrites the part of docs/operations.md between the two markers;
`python -m gpuyard.docsgen.settings --check` only says whether it is up to date (exit status 1 when not).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from gpuyard.shared.settings.client import ClientSettings
from gpuyard.shared.settings.common import CommonSettings
from gpuyard.shared.settings.environments import EnvironmentSettings
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.settings.gateway import GatewaySettings
from gpuyard.shared.settings.kubernetes import KubernetesConfig
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.names import default_text, env_name, flag_name
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.shared.settings.slurm import SlurmConfig
from gpuyard.shared.settings.storage import StorageSettings
from gpuyard.shared.settings.submit import SubmitSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BEGIN = (
    "<!-- settings tables: made by `python -m gpuyard.docsgen.settings` from shared/settings/; edit there -->"
)
END = "<!-- end of the settings tables -->"


@dataclass(frozen=True)
class Table:
    title: str
    intro: str
    model: type[BaseModel]
    skip: tuple[str, ...] = ()
    nested_in: str = ""
    """The field of ExecutorSettings the model is, for GPUYARD_KUBERNETES_* and --kubernetes.*."""
    flags: bool = True

    def rows(self) -> list[str]:
        rows = []
        for name, field in self.model.model_fields.items():
            if name in self.skip:
                continue
            flag = f"`{flag_name(name, self.nested_in)}`" if self.flags else "—"
            description = " ".join((field.description or "").split()).replace("|", "\\|")
            rows.append(
                f"| `{env_name(name, self.nested_in)}` | {flag} | {default_text(field)} | {description} |"
            )
        return rows

    def markdown(self) -> str:
        head = ["| variable | flag | default | meaning |", "|---|---|---|---|"]
        return "\n".join([f"### {self.title}", "", self.intro, "", *head, *self.rows()])


COMMON = tuple(CommonSettings.model_fields)
STORAGE = tuple(StorageSettings.model_fields)
ENVIRONMENTS = tuple(EnvironmentSettings.model_fields)
GATEWAY = tuple(name for name in GatewaySettings.model_fields if name not in COMMON)
TABLES = (
    Table("Every service", "Read by each of the five services.", CommonSettings),
    Table(
        "Storage",
        "Read by the submit API and the executor: the users jobs run as, the storage root, volumes.",
        StorageSettings,
        skip=COMMON,
    ),
    Table(
        "The executor gateway",
        "Read by the submit API and the executor: exec, shell and ports into running jobs (docs/access.md).",
        GatewaySettings,
        skip=COMMON,
    ),
    Table("The submit API", "`python -m gpuyard.services.submit`", SubmitSettings, skip=(*STORAGE, *GATEWAY)),
    Table("The scheduler", "`python -m gpuyard.services.scheduler`", SchedulerSettings, skip=COMMON),
    Table(
        "The executor",
        "`python -m gpuyard.services.executor`; its Kubernetes and Slurm backends' settings are in tables below.",
        ExecutorSettings,
        skip=(*ENVIRONMENTS, *GATEWAY, "kubernetes", "slurm"),
    ),
    Table(
        "Job environments",
        "Read by the executor: its local backend builds jobs' own Python environments (docs/environments.md).",
        EnvironmentSettings,
        skip=STORAGE,
    ),
    Table(
        "The executor's Kubernetes backend",
        "Read with `GPUYARD_EXECUTOR_BACKEND=kubernetes`; lists and mappings are JSON.",
        KubernetesConfig,
        nested_in="kubernetes",
    ),
    Table(
        "The executor's Slurm backend",
        "Read with `GPUYARD_EXECUTOR_BACKEND=slurm`; lists are JSON.",
        SlurmConfig,
        nested_in="slurm",
    ),
    Table("The monitor", "`python -m gpuyard.services.monitor`", MonitorSettings, skip=COMMON),
    Table("Model serving", "`python -m gpuyard.services.serving`", ServingSettings, skip=COMMON),
    Table(
        "The `gpuyard` CLI",
        "Variables only; each command's `--server` and `--token` come before them, and its `--context` before "
        "`GPUYARD_CONTEXT`.",
        ClientSettings,
        flags=False,
    ),
)


def generated() -> str:
    return "\n\n".join(table.markdown() for table in TABLES)


def with_tables(text: str) -> str:
    """`text` (docs/operations.md) with the part between the markers made anew."""
    before, begin, rest = text.partition(BEGIN)
    _, end, after = rest.partition(END)
    if not begin or not end:
        raise ValueError(f"{DOC.name} lacks the markers {BEGIN!r} and {END!r}")
    return f"{before}{BEGIN}\n\n{generated()}\n\n{END}{after}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpuyard.docsgen.settings", description=__doc__)
    parser.add_argument("--check", action="store_true", help="only say whether the docs are up to date")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    try:
        wanted = with_tables(text)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.check:
        if wanted != text:
            print(f"{DOC} is out of date: run python -m gpuyard.docsgen.settings", file=sys.stderr)
            return 1
        return 0
    if wanted != text:
        DOC.write_text(wanted)
        print(f"{DOC} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
