"""`gpuyard up`: the whole platform on this machine (gpuyard/supervisor/up.py, imported only when it runs: a
client's installation lacks the platform's packages, and then one line says what to install)."""

from __future__ import annotations

import argparse
import asyncio

from gpuyard.cli.common import out, platform_module
from gpuyard.supervisor.options import UpOptions
from gpuyard.supervisor.options import add_arguments as add_up_arguments


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """`up` takes its own options, not the client's `common` ones (it runs the platform the client talks to)."""
    del common
    up = sub.add_parser("up", help="run the whole platform on this machine")
    add_up_arguments(up)
    up.set_defaults(func=cmd_up)


def cmd_up(args: argparse.Namespace) -> int:
    up = platform_module("supervisor.up", "up")
    return asyncio.run(up.run_up(UpOptions.from_args(args), out))
