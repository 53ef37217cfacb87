"""Job environments: `gpuyard envs` (what each node holds: key, Python, packages, size, last used, in use; the
Python versions each node offers) and `gpuyard envs rm KEY [--node N]` (admins). And the reading of a spec's
`environment: {requirements: requirements.txt}`, whose lines `gpuyard submit` sends as `pip`."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.table import Table

from gpuyard.cli.common import age, api_client, out, print_json
from gpuyard.shared.contracts.api.environments import EnvironmentListOut, EnvironmentRemovedOut
from gpuyard.shared.contracts.specfiles import SpecError
from gpuyard.shared.contracts.units import format_size


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    envs = sub.add_parser(
        "envs", help="the job environments each node holds (environment: {pip: [...]})", parents=[common]
    )
    envs.add_argument("--node", help="one node only")
    envs.set_defaults(func=cmd_envs)
    envs_sub = envs.add_subparsers(dest="action", required=False, metavar="ACTION")
    rm = envs_sub.add_parser("rm", help="remove an environment from the nodes (admin)", parents=[common])
    rm.add_argument("key", metavar="KEY", help="the environment's key (gpuyard envs)")
    rm.add_argument("--node", help="from this node only (default: every node that holds it)")
    rm.set_defaults(func=cmd_envs_rm)


def cmd_envs(args: argparse.Namespace) -> int:
    params = {"node": args.node} if args.node else None
    listed = api_client(args).answer(EnvironmentListOut, "GET", "/v1/environments", params=params)
    if args.json:
        print_json(listed)
        return 0
    if not listed.items:
        out.print("no job environments on " + (f"node {args.node}" if args.node else "any node"))
    else:
        table = Table(box=None, pad_edge=False)
        for col in ("KEY", "NODE", "PYTHON", "PACKAGES", "SIZE", "LAST USED", "IN USE"):
            table.add_column(
                col, overflow="fold" if col == "PACKAGES" else "ellipsis", no_wrap=col != "PACKAGES"
            )
        for e in listed.items:
            used = str(e.in_use) if e.in_use else "-"
            table.add_row(
                e.key, e.node, e.python, e.packages, format_size(e.size_bytes), age(e.last_used), used
            )
        out.print(table)
    offered = "; ".join(f"{n.node}: {', '.join(n.pythons) or 'none'}" for n in listed.nodes)
    if offered:
        out.print(f"python versions offered: {offered}")
    return 0


def cmd_envs_rm(args: argparse.Namespace) -> int:
    params = {"node": args.node} if args.node else None
    path = f"/v1/environments/{args.key}"
    removed = api_client(args).answer(EnvironmentRemovedOut, "DELETE", path, params=params)
    if args.json:
        print_json(removed)
        return 0
    out.print(
        f"environment {removed.key}: removal sent to {', '.join(removed.nodes)} ({format_size(removed.size_bytes)})"
    )
    return 0


def with_requirements(spec: dict[str, Any], spec_file: str | Path) -> dict[str, Any]:
    """The spec with `environment.requirements` (a file beside the spec file) read into `environment.pip`, as
    the API takes it: its requirement lines in order, comments, blank lines and options (`-r`, `--index-url`:
    the platform's settings say where packages come from) refused with the file and line named."""
    env = spec.get("environment")
    if not isinstance(env, dict) or "requirements" not in env:
        return spec
    env = dict(env)
    name = env.pop("requirements")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{spec_file}: environment.requirements names a file, e.g. requirements.txt")
    path = Path(spec_file).parent / name
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{spec_file}: cannot read environment.requirements {path}: {exc}") from None
    pip = []
    for n, line in enumerate(lines, 1):
        text = line.split(" #", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if text.startswith("-"):
            raise SpecError(
                f"{path}, line {n}: options are not taken ({text.split()[0]}): list packages only"
            )
        if text:
            pip.append(text)
    env["pip"] = [*env.get("pip", []), *pip]
    return {**spec, "environment": env}
