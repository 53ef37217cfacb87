"""What the command groups of the CLI share: the output consoles, the one error they raise (`CliError`), the
options every command that talks to the API takes, the `Client` they talk through, and the platform's own
modules, imported only when a command needs them."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table
from rich.text import Text

from gpuyard.client import Client
from gpuyard.shared.contracts.units import format_duration
from gpuyard.shared.runtime.installhint import install_command

# Not on a terminal (pipes, CI, tests): no wrapping, so one error stays one line and tables stay whole.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class CliError(Exception):
    """A command's refusal: `main` prints it as one line on stderr and exits with status 1."""


def common_options() -> argparse.ArgumentParser:
    """The parent parser of every command that talks to the API: which platform, which token, JSON or not."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--context",
        metavar="NAME",
        help="the platform to talk to, as `gpuyard context ls` lists them (default: GPUYARD_CONTEXT, else the "
        "current one)",
    )
    common.add_argument("--server", help="API URL (default: GPUYARD_SERVER, else the context's)")
    common.add_argument("--token", help="bearer token (default: GPUYARD_TOKEN, else the context's)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    return common


def api_client(args: argparse.Namespace, *, say_retries: bool = False) -> Client:
    """The client of the API the command's options (or its context) name; with `say_retries`, each retry of
    a request that may be retried is said on stderr."""
    client = Client(args.server, args.token)
    if say_retries:
        client.on_retry = _say_retry
    return client


def _say_retry(why: str, seconds: float) -> None:
    err.print(f"{why}; trying again in {seconds:g} s", markup=False)


def platform_module(name: str, command: str) -> Any:
    """`gpuyard.NAME`, a part of the platform itself (`gpuyard up`, `backup`…): it needs the packages of the
    `platform` extra, which a client's installation (`pip install gpuyard`) lacks; then one line says so."""
    try:
        return importlib.import_module(f"gpuyard.{name}")
    except ModuleNotFoundError as exc:
        if (exc.name or "gpuyard").split(".")[0] == "gpuyard":
            raise
        raise CliError(
            f"gpuyard {command} runs the platform itself, and this installation has only the client (no "
            f"module named {exc.name!r}): {install_command('platform')}"
        ) from None


# ---------------------------------------------------------------- output


def print_json(data: BaseModel | Sequence[BaseModel | dict[str, Any]] | dict[str, Any]) -> None:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, Sequence):
        data = [item.model_dump(mode="json") if isinstance(item, BaseModel) else item for item in data]
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def key_value_table(rows: list[tuple[str, str]]) -> Table:
    """Rows of a name in bold and its value, folded: what `describe`, `why` and `models describe` print."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, Text(v))
    return table


def age(then: datetime | None) -> str:
    """How long ago `then` was, as people write it (5m, 2h 10m); '-' when unknown."""
    if then is None:
        return "-"
    return format_duration((datetime.now(UTC) - then).total_seconds())


def when(at: datetime | None, never: str) -> str:
    """`at` in UTC to the minute, or `never` when there is none."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if at is not None else never


@contextmanager
def transfer_progress(what: str, total: int | None):
    """A progress bar on stderr while bytes go (none when stderr is not a terminal)."""
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    with bar:
        task = bar.add_task(what, total=total)
        yield lambda n: bar.advance(task, n)
