"""The `gpuyard` command line. Errors are one line on stderr and a non-zero exit status, never a traceback.

One module per command group, each adding its commands with `register(sub, common)`:

- up.py: `gpuyard up`
- jobs.py: `submit`, `ps`, `describe`, `events`, `cancel`, `logs`, `why`
- access.py: `exec`, `shell`, `port-forward` (into a running job)
- dev.py: `dev start`, `ls`, `open`, `stop` (dev environments)
- artifacts.py: `artifacts` (what a job kept in its output folder)
- alerts.py: `alerts`; usage.py: `usage`; nodes.py: `top`, `nodes` (`cordon`, `drain`, `uncordon`)
- envs.py: `envs` (`rm`): the job environments the nodes hold
- models.py: `models …`; volumes.py: `volumes …`; admin.py: `admin tokens …`, `backup`, `bus-user`, `restore`; context.py: `context …`
- sim.py: `sim` (the simulator, run as its own program)

common.py holds what they share. The CLI talks to the submit API through `gpuyard.client` and renders the public
models of `gpuyard.shared.contracts.api`; it never imports a service."""

from __future__ import annotations

import argparse
import sys

from rich.markup import escape

from gpuyard.cli import (
    access,
    admin,
    alerts,
    artifacts,
    context,
    dev,
    envs,
    jobs,
    models,
    nodes,
    sim,
    up,
    usage,
    volumes,
)
from gpuyard.cli.common import CliError, common_options, err
from gpuyard.cli.sim import run_sim
from gpuyard.client import CHOSEN_CONTEXT, ClientError
from gpuyard.shared.contracts.version import VERSION

GROUPS = (
    up,
    jobs,
    dev,
    access,
    artifacts,
    alerts,
    usage,
    nodes,
    envs,
    models,
    volumes,
    admin,
    context,
    sim,
)  # in the order `gpuyard --help` lists


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuyard", description="GPUYARD: a GPU training platform.")
    parser.add_argument("--version", action="version", version=f"gpuyard {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = common_options()
    for group in GROUPS:
        group.register(sub, common)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:
        return run_sim(argv[1:])
    args = build_parser().parse_args(argv)
    chosen = CHOSEN_CONTEXT.set(getattr(args, "context", None))  # (for the clients this command makes)
    try:
        return args.func(args)
    except (CliError, ClientError) as exc:
        err.print(f"[bold red]error:[/] {escape(str(exc))}", markup=True)
        return 1
    except SystemExit as exc:
        if isinstance(exc.code, str):
            err.print(f"[bold red]error:[/] {escape(exc.code)}", markup=True)
            return 1
        raise
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    finally:
        CHOSEN_CONTEXT.reset(chosen)
