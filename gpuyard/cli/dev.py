"""Dev environments (docs/dev.md): `gpuyard dev start [--gpus 0.5] [--name N] [--env ENV] [--idle-timeout 2h]`,
`dev ls`, `dev open ID` (prints its URL; opens a browser where there is a display) and `dev stop ID`."""

from __future__ import annotations

import argparse
import os
import sys
import time
import webbrowser
from pathlib import Path
from typing import Any

from rich.table import Table

from gpuyard.cli.common import CliError, age, api_client, err, out, print_json
from gpuyard.cli.envs import with_requirements
from gpuyard.client import Client
from gpuyard.shared.contracts.api.dev import DevListOut, DevOut
from gpuyard.shared.contracts.api.jobs import CancelOut
from gpuyard.shared.contracts.devspec import DEV_PATH
from gpuyard.shared.contracts.jobstate import JobState
from gpuyard.shared.contracts.specfiles import SpecError

ID_HELP = "the dev environment's id (or a unique prefix of it)"
POLL_SECONDS = 0.1


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    dev = sub.add_parser("dev", help="dev environments: JupyterLab on the platform's GPUs", parents=[common])
    dev_sub = dev.add_subparsers(dest="action", required=True, metavar="ACTION")
    start = dev_sub.add_parser(
        "start", help="start a dev environment and wait until it answers", parents=[common]
    )
    start.add_argument("--gpus", type=float, default=0, help="whole GPUs or a share of one (default 0)")
    start.add_argument("--name", help="its name")
    start.add_argument(
        "--env",
        metavar="ENV",
        help="its own software: a requirements file, or packages separated by ',' (jupyterlab among them)",
    )
    start.add_argument("--python", metavar="X.Y", help="with --env: the environment's Python version")
    start.add_argument(
        "--idle-timeout", metavar="DURATION", help="stopped after this long idle (default 2h; off)"
    )
    start.add_argument("--priority", help="its priority class (default normal)")
    start.add_argument("--detach", action="store_true", help="do not wait for it to answer")
    start.add_argument(
        "--wait-timeout", type=float, default=600.0, metavar="S", help="how long to wait (600)"
    )
    start.set_defaults(func=cmd_start)
    ls = dev_sub.add_parser("ls", help="the dev environments of your tenant", parents=[common])
    ls.set_defaults(func=cmd_ls)
    opened = dev_sub.add_parser("open", help="print a dev environment's URL (and open it)", parents=[common])
    opened.add_argument("id", help=ID_HELP)
    opened.add_argument("--no-browser", action="store_true", help="only print the URL")
    opened.set_defaults(func=cmd_open)
    stop = dev_sub.add_parser(
        "stop", help="stop a dev environment (its notebooks are kept)", parents=[common]
    )
    stop.add_argument("id", help=ID_HELP)
    stop.set_defaults(func=cmd_stop)


def environment_of(env: str | None, python: str | None) -> dict[str, Any] | None:
    """`--env`: a requirements file's lines, or packages separated by ','; with `--python`, its version."""
    if env is None:
        return {"python": python} if python else None
    if Path(env).is_file():
        try:
            spec = with_requirements({"environment": {"requirements": env}}, Path.cwd() / "dev.yaml")
        except SpecError as exc:
            raise CliError(str(exc)) from None
        found: dict[str, Any] = spec["environment"]
    else:
        found = {"pip": [p.strip() for p in env.split(",") if p.strip()]}
    return {**found, "python": python} if python else found


def body_of(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"gpus": args.gpus}
    if args.name:
        body["name"] = args.name
    environment = environment_of(args.env, args.python)
    if environment:
        body["environment"] = environment
    if args.idle_timeout is not None:
        body["idle_timeout"] = args.idle_timeout
    if args.priority:
        body["priority"] = args.priority
    return body


def url_of(client: Client, dev: DevOut) -> str:
    return client.server + dev.url


def wait_answering(client: Client, dev: DevOut, timeout: float) -> DevOut:
    """Wait until the environment runs and its JupyterLab answers through the platform; CliError when it ends
    first (with its reason) or `timeout` passes."""
    deadline = time.monotonic() + timeout
    said = ""
    while time.monotonic() < deadline:
        dev = client.answer(DevOut, "GET", f"/v1/dev/{dev.job_id}")
        if dev.state.terminal:
            raise CliError(
                f"dev environment {dev.job_id} {dev.state.value}: {dev.message or 'see gpuyard logs'}"
            )
        if dev.state != JobState.RUNNING and dev.message and dev.message != said:
            err.print(f"{dev.state.value}: {dev.message}")
            said = dev.message
        if dev.state == JobState.RUNNING:
            answer = client.http.get(f"{DEV_PATH}/{dev.job_id}/api/status")
            if answer.status_code == 200:
                return dev
        time.sleep(POLL_SECONDS)
    raise CliError(f"dev environment {dev.job_id} did not answer within {timeout:g} s (gpuyard dev ls)")


def cmd_start(args: argparse.Namespace) -> int:
    client = api_client(args)
    dev = client.answer(DevOut, "POST", "/v1/dev", json=body_of(args))
    if not args.detach:
        dev = wait_answering(client, dev, args.wait_timeout)
    if args.json:
        print_json(dev)
        return 0
    out.print(f"dev environment {dev.job_id} ({dev.name}): {dev.state.value}")
    out.print(url_of(client, dev), soft_wrap=True)
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    client = api_client(args)
    listed = client.answer(DevListOut, "GET", "/v1/dev")
    if args.json:
        print_json(listed)
        return 0
    if not listed.items:
        out.print("no dev environments (gpuyard dev start)")
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("ID", "NAME", "STATE", "GPUS", "USER", "AGE", "URL"):
        table.add_column(col, no_wrap=True)
    for d in listed.items:
        table.add_row(
            d.job_id, d.name, d.state.value, f"{d.gpus:g}", d.user, age(d.submitted_at), url_of(client, d)
        )
    out.print(table)
    return 0


def has_display() -> bool:
    return sys.platform in ("darwin", "win32") or bool(
        os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
    )


def cmd_open(args: argparse.Namespace) -> int:
    client = api_client(args)
    dev = client.answer(DevOut, "GET", f"/v1/dev/{args.id}")
    url = url_of(client, dev)
    if args.json:
        print_json({"job_id": dev.job_id, "url": url, "state": dev.state.value})
        return 0
    out.print(url, soft_wrap=True)
    if dev.state != JobState.RUNNING:
        err.print(f"dev environment {dev.job_id} is {dev.state.value}: its page answers once it runs")
    if not args.no_browser and has_display():
        webbrowser.open(url)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    client = api_client(args)
    stopped = client.answer(CancelOut, "DELETE", f"/v1/dev/{args.id}")
    if args.json:
        print_json(stopped)
        return 0
    out.print(f"dev environment {stopped.job_id}: {stopped.message}")
    return 0
