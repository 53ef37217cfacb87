"""The jobs' commands: `gpuyard submit`, `ps`, `describe`, `events`, `cancel`, `logs` and `why`."""

from __future__ import annotations

import argparse
import contextlib
import sys
from datetime import UTC, datetime

from pydantic import ValidationError
from rich.table import Table
from rich.text import Text

from gpuyard.cli.common import CliError, age, api_client, err, key_value_table, out, print_json
from gpuyard.cli.envs import with_requirements
from gpuyard.client import Client, ClientError
from gpuyard.follow import describe_event, follow_job, parse_event
from gpuyard.shared.contracts.api.jobs import JobOut, pending_text
from gpuyard.shared.contracts.events.jobs import lost_work_text
from gpuyard.shared.contracts.jobspec import JobSpec, start_error
from gpuyard.shared.contracts.jobstate import LIVE_STATES, JobState, in_order
from gpuyard.shared.contracts.specfiles import SpecError, load_spec_file
from gpuyard.shared.contracts.units import format_duration, format_size
from gpuyard.shared.reporting import why

JOB_ARGUMENT = "the job's id, or a unique prefix of it (4 characters or more)"
ALL_ATTEMPTS = "all"
LOG_LINES_OF_A_FAILURE = 10


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    _add_submit(sub, common)
    _add_ps(sub, common)
    for name, func, text in (
        ("describe", cmd_describe, "show one job"),
        ("events", cmd_events, "a job's events, in order"),
        ("cancel", cmd_cancel, "cancel a job"),
    ):
        p = sub.add_parser(name, help=text, parents=[common])
        p.add_argument("job", help=JOB_ARGUMENT)
        p.set_defaults(func=func)
    _add_logs(sub, common)
    why_cmd = sub.add_parser(
        "why", help="why a job waits (reason, numbers, queue position, estimated start)", parents=[common]
    )
    why_cmd.add_argument("job", help=JOB_ARGUMENT)
    why_cmd.set_defaults(func=cmd_why)


def _add_submit(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    submit = sub.add_parser("submit", help="submit a job spec (YAML or JSON)", parents=[common])
    submit.add_argument("file")
    submit.add_argument("--name", help="override the spec's name")
    submit.add_argument(
        "-f", "--follow", action="store_true", help="print the job's events and output until it ends"
    )
    submit.add_argument(
        "--no-logs", action="store_true", help="with --follow: the events only, not the replicas' output"
    )
    submit.set_defaults(func=cmd_submit)


def _add_ps(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    ps = sub.add_parser("ps", help="list jobs", parents=[common])
    ps.add_argument("-a", "--all", action="store_true", help="include finished jobs")
    ps.add_argument(
        "--state",
        action="append",
        type=JobState,
        choices=list(JobState),
        metavar="STATE",
        help=f"only jobs in this state (repeatable): {', '.join(JobState)}",
    )
    ps.add_argument("--tenant", help="only this tenant's jobs (admins; a tenant's token sees its own)")
    ps.add_argument("--user", help="only the jobs this user submitted")
    ps.add_argument("--name", help="only the jobs of this name")
    ps.add_argument(
        "--search",
        metavar="TEXT",
        help="only the jobs whose id, name, user or tenant holds TEXT (ASCII letters in either case)",
    )
    ps.add_argument("--limit", type=int, default=50, help="at most this many jobs, newest first (50)")
    ps.set_defaults(func=cmd_ps)


def _add_logs(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    logs = sub.add_parser("logs", help="a job's output", parents=[common])
    logs.add_argument("job", help=JOB_ARGUMENT)
    logs.add_argument("-f", "--follow", action="store_true", help="stream until the job ends")
    logs.add_argument("--replica", type=int, default=0, help="which replica's output (0)")
    logs.add_argument(
        "--attempt",
        type=attempt_arg,
        help="which attempt's output: its number (default: the latest), or all: every attempt's, in order, each "
        "after a line that names it and says how it ended",
    )
    logs.add_argument("--tail", type=int, help="only the last N lines")
    logs.set_defaults(func=cmd_logs)


# ---------------------------------------------------------------- submit


def cmd_submit(args: argparse.Namespace) -> int:
    spec = _checked_spec(args.file, args.name)
    client = api_client(args, say_retries=True)
    accepted = client.submit(spec)  # one Idempotency-Key for this submission and its retries
    if args.json and not args.follow:
        print_json(accepted)
        return 0
    out.print(f"submitted job [bold]{accepted.job_id}[/] ({accepted.name}), {accepted.state}")
    if not args.follow:
        return 0
    state = follow_job(client, accepted.job_id, out, logs=not args.no_logs)
    job = client.job(accepted.job_id)
    if args.json:
        print_json(job)
    else:
        out.print(f"job {job.job_id} {state}" + (f": {job.message}" if job.message else ""))
    return 0 if state == JobState.SUCCEEDED else 1


def _checked_spec(file: str, name: str | None) -> dict:
    """The spec in `file` (renamed to `name`, if given), checked as the server checks it, before the network."""
    try:
        spec = with_requirements(load_spec_file(file), file)  # (environment.requirements read into pip)
        if name:
            spec["name"] = name
        checked = JobSpec.model_validate(spec)
        if (too_large := start_error(checked)) is not None:
            raise SpecError(f"{file}: {too_large}")
    except SpecError as exc:
        raise CliError(str(exc)) from None
    except ValidationError as exc:
        raise CliError(f"{file}: {_spec_errors(exc)}") from None
    return spec


def _spec_errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or 'spec'}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()
    )


# ---------------------------------------------------------------- ps


def cmd_ps(args: argparse.Namespace) -> int:
    client = api_client(args)
    states = args.state or (None if args.all else in_order(LIVE_STATES))
    page = client.jobs(
        state=states, tenant=args.tenant, limit=args.limit, user=args.user, name=args.name, search=args.search
    )
    jobs = page.items
    if args.json:
        print_json(jobs)
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("ID", "NAME", "TENANT", "STATE", "POS", "GPUS", "AGE", "REASON"):
        table.add_column(col, overflow="fold" if col == "REASON" else "ellipsis", no_wrap=col != "REASON")
    for j in jobs:
        table.add_row(
            j.job_id,
            j.name,
            j.tenant,
            j.state,
            why.position_text(j.pending),
            _gpus(j),
            age(j.created_at),
            Text(_ps_reason(j)),
        )
    if not jobs:
        out.print("no jobs" + ("" if args.all else " running or waiting (use --all to see finished ones)"))
    else:
        out.print(table)
        if page.total is not None and page.total > len(jobs):
            out.print(f"{len(jobs)} of {page.total} jobs, the newest (--limit for more)")
    return 0


def _gpus(job: JobOut) -> str:
    per, replicas = job.spec.resources.gpus, job.spec.replicas
    if not per:
        return "-"
    return f"{replicas}×{per:g}" if replicas > 1 else f"{per:g}"


def _ps_reason(job: JobOut) -> str:
    """Why a queued job waits; for others, what `ps` readers need (preemption, cancel, how it ended)."""
    if job.pending:
        return pending_text(job.pending)
    if job.state.terminal:
        return job.message
    if job.cancel_requested:
        return "cancel requested"
    if job.preemption:
        return f"being preempted ({job.preemption.cause})"
    return f"attempt {job.attempt}" if job.attempt > 1 else ""


# ---------------------------------------------------------------- describe


def cmd_describe(args: argparse.Namespace) -> int:
    client = api_client(args)
    job = client.job(args.job)
    if args.json:
        print_json(job)
        return 0
    rows = _describe_rows(job)
    gpu_use = _gpu_use_text(client, job)
    if gpu_use:
        rows.append(("GPU use", gpu_use))
    out.print(key_value_table(rows))
    if job.failure:
        _print_last_lines(client, job)
    return 0


def _describe_rows(job: JobOut) -> list[tuple[str, str]]:
    """What `describe` prints of a job, row by row (its GPU use aside: that one asks the API)."""
    spec = job.spec
    cancelling = job.cancel_requested and not job.state.terminal
    rows = [
        ("Job", f"{job.job_id} ({job.name})"),
        ("Tenant / user", f"{job.tenant} / {job.user}"),
        ("State", job.state + (" (cancel requested)" if cancelling else "")),
        ("Attempt", str(job.attempt)),
        _what_it_runs(spec),
        ("Resources", why.resources_text(spec)),
        ("Priority", spec.priority),
        ("Created", f"{job.created_at.isoformat()} ({age(job.created_at)} ago)"),
    ]
    if spec.idle_timeout is not None or spec.idle_grace is not None:
        rows.insert(-1, ("Idle timeout", _idle_text(spec)))
    rows += _waiting_rows(job)
    for p in job.placements:
        gpus = ",".join(f"{g.index}" + (f"×{g.fraction:g}" if g.fraction < 1 else "") for g in p.gpus)
        rows.append((f"Replica {p.replica}", p.node + (f" GPU {gpus}" if gpus else "")))
    if job.failure:
        rows.append(("Failure", why.failure_text(job)))
    elif job.message:
        rows.append(("Message", job.message))
    for a in job.attempts:
        rows.append(
            (f"Attempt {a.number}", f"{a.summary or 'in progress'} · nodes {', '.join(a.nodes) or '-'}")
        )
        rows.extend(("", f"note: {note}") for note in a.notes)
    if job.checkpoint:
        c = job.checkpoint
        rows.append(
            (
                "Checkpoint",
                f"step {c.step} · {format_size(c.size_bytes)} · saved {age(c.saved_at)} ago by attempt {c.attempt}",
            )
        )
    return rows


def _waiting_rows(job: JobOut) -> list[tuple[str, str]]:
    """Why the job waits (with the numbers and its estimated start), and whether it is being preempted."""
    rows = []
    if job.pending:
        rows.append(("Waiting", pending_text(job.pending)))
        if job.pending.details:
            rows.append(("Numbers", why.details_text(job.pending.details)))
        rows.append(("Estimated start", why.relative_start(job.pending.estimated_start, datetime.now(UTC))))
    if job.preemption:
        pre = job.preemption
        lost = lost_work_text(pre.lost_work_seconds)
        by = f" by job {pre.by_job}" if pre.by_job else ""
        rows.append(("Preempted", f"{pre.reason}{by}, stopping" + (f"; {lost}" if lost else "")))
    return rows


def _gpu_use_text(client: Client, job: JobOut) -> str | None:
    """The job's mean GPU utilization over its run and its GPU-hours, when the GPU history knows them."""
    if not job.gpus:
        return None
    with contextlib.suppress(ClientError):  # an older server, or no history: the rest is still shown
        use = client.job_gpu(job.job_id)
        if use.mean_utilization_pct is None:
            return None
        return (
            f"{use.mean_utilization_pct:.0f}% mean utilization over its run · "
            f"{use.used_gpu_hours:.2f} of {use.allocated_gpu_hours:.2f} GPU-hours used"
        )
    return None


def _idle_text(spec: JobSpec) -> str:
    """'30m, grace 10m', 'off', or the tenant's default (the monitor knows it, the spec does not)."""
    if spec.idle_timeout == 0:
        return "off (never stopped for idle GPUs)"
    timeout = "its tenant's default" if spec.idle_timeout is None else format_duration(spec.idle_timeout)
    grace = "" if spec.idle_grace is None else f", grace {format_duration(spec.idle_grace)}"
    return f"{timeout}{grace} (stopped when its GPUs stay idle that long)"


def _what_it_runs(spec: JobSpec) -> tuple[str, str]:
    """The command a job runs, the model a serve job serves, or a dev environment's notebooks."""
    if spec.serve is not None:
        owner = f" (tenant {spec.serve.tenant}'s)" if spec.serve.tenant else ""
        return "Serves", f"model {spec.serve.job_name}{owner}"
    if spec.dev is not None:
        return "Runs", f"a dev environment (JupyterLab), notebooks in {spec.dev.root}/"
    return "Command", spec.command if isinstance(spec.command, str) else " ".join(spec.command or [])


def _print_last_lines(client: Client, job: JobOut) -> None:
    """The last lines of the log of the replica that failed the job (of replica 0 when none did)."""
    replica = job.failure.replica if job.failure and job.failure.replica is not None else 0
    with contextlib.suppress(ClientError):  # no log kept: the rows above say what is known
        lines = client.logs(job.job_id, replica=replica, attempt=job.attempt, tail=LOG_LINES_OF_A_FAILURE)
        if lines.strip():
            out.print(f"[bold]Last log lines of replica {replica}:[/]")
            for line in lines.splitlines():
                out.print(f"  {line}", markup=False)


# ---------------------------------------------------------------- events, cancel, why


def cmd_events(args: argparse.Namespace) -> int:
    events = api_client(args).events(args.job)
    if args.json:
        print_json(events)
        return 0
    for item in events:
        event = parse_event(item.event)
        if event is None:  # a newer server's event
            out.print(f"{item.version:>3}  {item.event.get('time', '')}  {item.event.get('type', '?')}")
            continue
        out.print(
            f"{item.version:>3}  {event.time.isoformat()}  {event.nats_subject:<22} {describe_event(event)}"
        )
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    answer = api_client(args).cancel(args.job)
    if args.json:
        print_json(answer)
    else:
        out.print(f"job {answer.job_id}: {answer.message}")
    return 0


def cmd_why(args: argparse.Namespace) -> int:
    job = api_client(args).job(args.job)
    now = datetime.now(UTC)
    if args.json:
        print_json(why.as_dict(job, now))
        return 0
    headline, rows = why.explain(job, now)
    out.print(Text(headline, style="bold"))
    out.print(key_value_table(rows))
    return 0


# ---------------------------------------------------------------- logs


def cmd_logs(args: argparse.Namespace) -> int:
    client = api_client(args)
    params = {"replica": args.replica, "attempt": args.attempt, "tail": args.tail}
    if args.follow:
        for chunk in client.follow_logs(args.job, **params):
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        return 0
    text = client.logs(args.job, **params)
    sys.stdout.write(text)
    if not text:
        err.print(no_output_text(client.job(args.job), args.replica, args.attempt), markup=False)
    return 0


def attempt_arg(text: str) -> int | str:
    """`logs --attempt`: an attempt's number (from 1), or `all`."""
    if text == ALL_ATTEMPTS:
        return text
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not an attempt: give its number (1, 2…) or {ALL_ATTEMPTS}")


def no_output_text(job: JobOut, replica: int, attempt: int | str | None = None) -> str:
    """Why `logs` printed nothing: the attempt has not started (and why it waits), or the replica wrote nothing;
    for a later attempt, where the output of the one before it is."""
    number = job.attempt if attempt is None or attempt == ALL_ATTEMPTS else int(attempt)
    which = f"job {job.job_id}" if number == 1 else f"attempt {number} of job {job.job_id}"
    if number != job.attempt:  # an earlier attempt, over
        past = next((a for a in job.attempts if a.number == number), None)
        if past is not None and past.started_at is None:
            return f"no output: {which} ended ({past.summary or 'over'}) before it started"
        return f"no output: replica {replica} of {which} wrote nothing"
    ran = [a.number for a in job.attempts if a.number < number and a.started_at is not None]
    where = ""
    if ran:
        flag = f" --replica {replica}" if replica else ""
        where = (
            f"; attempt {ran[-1]}'s output: gpuyard logs {job.job_id}{flag} --attempt {ran[-1]} (every "
            f"attempt's: --attempt {ALL_ATTEMPTS})"
        )
    if job.started_at is None and not job.state.terminal:
        waiting = f": {pending_text(job.pending)}" if job.pending else ""
        return f"no output: {which} has not started yet ({job.state}{waiting}){where}"
    if job.started_at is None:
        return f"no output: {which} ended ({job.state}) before it started{where}"
    return (
        f"no output: replica {replica} of {which} has written nothing"
        + ("" if job.state.terminal else " yet")
        + where
    )
