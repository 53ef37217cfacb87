"""`gpuyard sim ARGS`: the scheduling simulator (gpuyard/shared/scheduling/sim/), run as its own program with
ARGS unchanged; `main` hands it the command line before any parsing."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

from rich.markup import escape

from gpuyard.cli.common import err
from gpuyard.shared.runtime.installhint import install_command

SIM_NEEDS = ("numpy",)  # the scheduling core's own package beyond the client's (the `platform` extra)
SIM_MODULE = (
    "gpuyard.shared.scheduling.sim"  # run as a program: `gpuyard sim ARGS` is `python -m SIM_MODULE ARGS`
)


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """Listed for `gpuyard --help` only: the simulator parses its own arguments (`gpuyard sim --help`)."""
    del common
    sub.add_parser(
        "sim",
        help="replay a trace through the scheduler, one result row per policy (gpuyard sim --help)",
        add_help=False,
    )


def run_sim(argv: list[str]) -> int:
    """`gpuyard sim ARGS`: the simulator as its own program, given ARGS unchanged (its output, its help and
    its exit status are the simulator's). Returns only when the scheduling core's packages are not installed."""
    missing = [name for name in SIM_NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        err.print(
            f"[bold red]error:[/] gpuyard sim runs the platform's scheduler, and this installation has only the "
            f"client (no module named {missing[0]!r}): {escape(install_command('platform'))}",
            markup=True,
        )
        return 2
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-P", "-m", SIM_MODULE, *argv])
    return 0  # (not reached: execv replaced this process)
