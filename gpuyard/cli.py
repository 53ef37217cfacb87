"""The `gpuyard` command line. Errors are one line on stderr and a non-zero exit status, never a traceback."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from rich.text import Text

from gpuyard import why
from gpuyard.client import Client, ClientError
from gpuyard.follow import TERMINAL, describe_event, follow_job
from gpuyard.up import UpOptions, run_up
from gpuyard.up import add_arguments as add_up_arguments
from shared.jobspec import JobSpec, SpecError, load_spec_file
from shared.units import format_duration

# Not on a terminal (pipes, CI, tests): no wrapping, so one error stays one line and tables stay whole.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)


class CliError(Exception):
    pass


def _age(iso: str | None) -> str:
    if not iso:
        return "-"
    then = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    return format_duration((datetime.now(UTC) - then).total_seconds())


def _gpus(job: dict[str, Any]) -> str:
    per, replicas = job["spec"]["resources"]["gpus"], job["spec"]["replicas"]
    if not per:
        return "-"
    return f"{replicas}×{per:g}" if replicas > 1 else f"{per:g}"


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _spec_errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or 'spec'}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()
    )


# ---------------------------------------------------------------- commands


def cmd_up(args: argparse.Namespace) -> int:
    return asyncio.run(run_up(UpOptions.from_args(args), out))


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        spec = load_spec_file(args.file)
        if args.name:
            spec["name"] = args.name
        JobSpec.model_validate(spec)  # the same validation as the server, before the network
    except SpecError as exc:
        raise CliError(str(exc)) from None
    except ValidationError as exc:
        raise CliError(f"{args.file}: {_spec_errors(exc)}") from None
    client = Client(args.server, args.token)
    accepted = client.submit(spec)
    if args.json and not args.follow:
        _print_json(accepted)
        return 0
    out.print(f"submitted job [bold]{accepted['job_id']}[/] ({accepted['name']}), {accepted['state']}")
    if not args.follow:
        return 0
    state = follow_job(client, accepted["job_id"], out)
    job = client.job(accepted["job_id"])
    if args.json:
        _print_json(job)
    else:
        out.print(f"job {job['job_id']} {state}" + (f": {job['message']}" if job.get("message") else ""))
    return 0 if state == "succeeded" else 1


def cmd_ps(args: argparse.Namespace) -> int:
    client = Client(args.server, args.token)
    states = args.state or (None if args.all else ["queued", "placed", "running"])
    page = client.jobs(state=states, tenant=args.tenant, limit=args.limit)
    jobs = page["items"]
    if args.json:
        _print_json(jobs)
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("ID", "NAME", "TENANT", "STATE", "POS", "GPUS", "AGE", "REASON"):
        table.add_column(col, overflow="fold" if col == "REASON" else "ellipsis", no_wrap=col != "REASON")
    for j in jobs:
        table.add_row(
            j["job_id"],
            j["name"],
            j["tenant"],
            j["state"],
            why.position_text(j.get("pending")) if j["state"] == "queued" else "",
            _gpus(j),
            _age(j["created_at"]),
            Text(_ps_reason(j)),
        )
    if not jobs:
        out.print("no jobs" + ("" if args.all else " running or waiting (use --all to see finished ones)"))
    else:
        out.print(table)
    return 0


def _ps_reason(job: dict[str, Any]) -> str:
    """Why a queued job waits; for others, what `ps` readers need (preemption, cancel, how it ended)."""
    if job["state"] == "queued":
        pending = job.get("pending")
        return f"{pending['code']}: {pending['message']}" if pending else ""
    if job["state"] in TERMINAL:
        return job.get("message", "")
    if job.get("cancel_requested"):
        return "cancel requested"
    if job.get("preempt_requested"):
        return f"being preempted ({job['preempt_requested']['reason']})"
    return f"attempt {job['attempt']}" if job["attempt"] > 1 else ""


def cmd_describe(args: argparse.Namespace) -> int:
    job = Client(args.server, args.token).job(args.job)
    if args.json:
        _print_json(job)
        return 0
    spec = job["spec"]
    command = spec["command"] if isinstance(spec["command"], str) else " ".join(spec["command"])
    rows = [
        ("Job", f"{job['job_id']} ({job['name']})"),
        ("Tenant / user", f"{job['tenant']} / {job['user']}"),
        (
            "State",
            job["state"]
            + (" (cancel requested)" if job["cancel_requested"] and job["state"] not in TERMINAL else ""),
        ),
        ("Attempt", str(job["attempt"])),
        ("Command", command),
        (
            "Resources",
            f"{_gpus(job)} GPU · {spec['resources']['cpus']:g} CPU · {spec['resources']['memory']} B memory",
        ),
        ("Priority", spec["priority"]),
        ("Created", f"{job['created_at']} ({_age(job['created_at'])} ago)"),
    ]
    if job.get("pending") and job["state"] == "queued":
        p = job["pending"]
        rows.append(
            (
                "Waiting",
                f"{p['code']}: {p['message']}"
                + (f" (#{p['position']} in queue)" if p.get("position") else ""),
            )
        )
        if p.get("details"):
            rows.append(("Numbers", why.details_text(p["details"])))
        rows.append(("Estimated start", why.relative_start(p.get("estimated_start"), datetime.now(UTC))))
    if job.get("preempt_requested") and job["state"] in ("placed", "running"):
        pre = job["preempt_requested"]
        rows.append(
            (
                "Preempted",
                pre["reason"] + (f" by job {pre['by_job']}" if pre.get("by_job") else "") + ", stopping",
            )
        )
    for p in job["placements"]:
        gpus = ",".join(
            f"{g['index']}" + (f"×{g['fraction']:g}" if g["fraction"] < 1 else "") for g in p["gpus"]
        )
        rows.append((f"Replica {p['replica']}", f"{p['node']}" + (f" GPU {gpus}" if gpus else "")))
    if job.get("exit_code") is not None:
        rows.append(("Exit code", str(job["exit_code"])))
    if job.get("message"):
        rows.append(("Message", job["message"]))
    for a in job["attempts"]:
        rows.append(
            (
                f"Attempt {a['number']}",
                f"{a.get('outcome') or 'in progress'} · nodes {', '.join(a['nodes']) or '-'}",
            )
        )
        rows.extend(("", f"note: {note}") for note in a.get("notes", []))
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, Text(v))
    out.print(table)
    if job.get("log_tail") and job["state"] == "failed":
        out.print("[bold]Last log lines:[/]")
        for line in job["log_tail"]:
            out.print(f"  {line}", markup=False)
    return 0


def cmd_why(args: argparse.Namespace) -> int:
    job = Client(args.server, args.token).job(args.job)
    now = datetime.now(UTC)
    if args.json:
        _print_json(why.as_dict(job, now))
        return 0
    headline, rows = why.explain(job, now)
    out.print(Text(headline, style="bold"))
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, Text(v))
    out.print(table)
    return 0


PLOT_SUFFIXES = (".png", ".svg", ".pdf")
SIM_POSITIVE = {
    "seeds": "--seeds",
    "ratio": "--ratio",
    "speedup": "--speedup",
    "limit_factor": "--limit-factor",
}


def cmd_sim(args: argparse.Namespace) -> int:
    from services.scheduler.sim import cli as sim

    for field, flag in SIM_POSITIVE.items():
        value = getattr(args, field, None)
        if value is not None and value <= 0:
            raise CliError(f"{flag} must be positive, not {value:g}")
    fraction = getattr(args, "cluster_fraction", None)
    if fraction is not None and not 0 < fraction <= 1:
        raise CliError(f"--cluster-fraction must be in (0, 1], not {fraction:g}")
    if args.plot is not None:
        folder = args.plot.resolve().parent
        if not folder.is_dir():
            raise CliError(f"--plot {args.plot}: folder {folder} does not exist")
        if args.plot.suffix.lower() not in PLOT_SUFFIXES:
            raise CliError(f"--plot {args.plot}: the file name must end in {', '.join(PLOT_SUFFIXES)}")
    try:
        return sim.run(args)
    except OSError as exc:  # a folder or an unreadable file given as a trace: one line, not a traceback
        what = f"cannot read {exc.filename}: " if exc.filename else ""
        raise CliError(f"{what}{exc.strerror or exc}") from None


def cmd_events(args: argparse.Namespace) -> int:
    events = Client(args.server, args.token).events(args.job)
    if args.json:
        _print_json(events)
        return 0
    for item in events:
        e = item["event"]
        out.print(
            f"{item['version']:>3}  {e['time']}  {e['type'].removeprefix('io.gpuyard.'):<22} {describe_event(e)}"
        )
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    client = Client(args.server, args.token)
    params = {"replica": args.replica, "attempt": args.attempt, "tail": args.tail}
    if args.follow:
        for chunk in client.follow_logs(args.job, **params):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        return 0
    sys.stdout.write(client.logs(args.job, **params))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    answer = Client(args.server, args.token).cancel(args.job)
    if args.json:
        _print_json(answer)
    else:
        out.print(f"job {answer['job_id']}: {answer['message']}")
    return 0


# ---------------------------------------------------------------- parser


def build_parser(sim_options: bool = True) -> argparse.ArgumentParser:
    """sim_options=False leaves out the simulator's options (and its numpy import) for the other commands."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--server", help="API URL (default: GPUYARD_SERVER, or what `gpuyard up` saved)")
    common.add_argument("--token", help="bearer token (default: GPUYARD_TOKEN, or what `gpuyard up` saved)")
    common.add_argument("--json", action="store_true", help="machine-readable output")

    parser = argparse.ArgumentParser(prog="gpuyard", description="GPUYARD: a GPU training platform.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run the whole platform on this machine", parents=[common])
    add_up_arguments(up)
    up.set_defaults(func=cmd_up)

    submit = sub.add_parser("submit", help="submit a job spec (YAML or JSON)", parents=[common])
    submit.add_argument("file")
    submit.add_argument("--name", help="override the spec's name")
    submit.add_argument("-f", "--follow", action="store_true", help="print the job's events until it ends")
    submit.set_defaults(func=cmd_submit)

    ps = sub.add_parser("ps", help="list jobs", parents=[common])
    ps.add_argument("-a", "--all", action="store_true", help="include finished jobs")
    ps.add_argument("--state", action="append", help="only jobs in this state (repeatable)")
    ps.add_argument("--tenant")
    ps.add_argument("--limit", type=int, default=50)
    ps.set_defaults(func=cmd_ps)

    for name, func, text in (
        ("describe", cmd_describe, "show one job"),
        ("events", cmd_events, "a job's events, in order"),
        ("cancel", cmd_cancel, "cancel a job"),
    ):
        p = sub.add_parser(name, help=text, parents=[common])
        p.add_argument("job")
        p.set_defaults(func=func)

    logs = sub.add_parser("logs", help="a job's output", parents=[common])
    logs.add_argument("job")
    logs.add_argument("-f", "--follow", action="store_true", help="stream until the job ends")
    logs.add_argument("--replica", type=int, default=0)
    logs.add_argument("--attempt", type=int)
    logs.add_argument("--tail", type=int, help="only the last N lines")
    logs.set_defaults(func=cmd_logs)

    why_cmd = sub.add_parser(
        "why", help="why a job waits (reason, numbers, queue position, estimated start)", parents=[common]
    )
    why_cmd.add_argument("job")
    why_cmd.set_defaults(func=cmd_why)

    sim = sub.add_parser(
        "sim",
        help="replay a trace through the scheduler, one result row per policy",
        description="Replay a cluster trace (openb CSV columns) through the scheduling core and compare "
        "placement policies; the table goes to stderr, --json to stdout.",
    )
    if sim_options:
        from services.scheduler.sim.cli import add_arguments

        add_arguments(sim)
    sim.set_defaults(func=cmd_sim)
    return parser


def _command(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(sim_options=_command(argv) == "sim")
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (CliError, ClientError) as exc:
        err.print(f"[bold red]error:[/] {exc}", markup=True)
        return 1
    except SystemExit as exc:
        if isinstance(exc.code, str):
            err.print(f"[bold red]error:[/] {exc.code}", markup=True)
            return 1
        raise
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
