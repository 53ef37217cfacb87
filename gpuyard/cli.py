"""The `gpuyard` command line. Errors are one line on stderr and a non-zero exit status, never a traceback.

It talks to the submit API through `gpuyard.client` and renders the public models of `gpuyard.shared.contracts.api`; it never
imports a service (`gpuyard sim` runs the simulator as its own program)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpuyard import contexts
from gpuyard.client import CHOSEN_CONTEXT, Client, ClientError
from gpuyard.follow import describe_event, follow_job, parse_event
from gpuyard.shared.contracts.api.alerts import AlertOut
from gpuyard.shared.contracts.api.jobs import JobOut, pending_text
from gpuyard.shared.contracts.api.models import ReplicaOut
from gpuyard.shared.contracts.api.nodes import NodeOut
from gpuyard.shared.contracts.api.usage import UsageOut
from gpuyard.shared.contracts.events.alerts import AlertSeverity
from gpuyard.shared.contracts.jobspec import PRIORITY_CLASSES, JobSpec, SpecError, load_spec_file, start_error
from gpuyard.shared.contracts.jobstate import LIVE_STATES, JobState, in_order
from gpuyard.shared.contracts.units import format_duration, format_size
from gpuyard.shared.contracts.version import VERSION
from gpuyard.shared.reporting import why
from gpuyard.shared.reporting.usage import CSV_COLUMNS
from gpuyard.shared.runtime.installhint import install_command
from gpuyard.shared.settings.client import ClientSettings
from gpuyard.shared.settings.common import CommonSettings
from gpuyard.supervisor.options import UpOptions
from gpuyard.supervisor.options import add_arguments as add_up_arguments
from gpuyard.top import run_top

# Not on a terminal (pipes, CI, tests): no wrapping, so one error stays one line and tables stay whole.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, soft_wrap=True)

SIM_NEEDS = ("numpy",)  # the scheduling core's own package beyond the client's (the `platform` extra)
SIM_MODULE = (
    "gpuyard.shared.scheduling.sim"  # run as a program: `gpuyard sim ARGS` is `python -m SIM_MODULE ARGS`
)
LOG_LINES_OF_A_FAILURE = 10


class CliError(Exception):
    pass


def _age(then: datetime | None) -> str:
    if then is None:
        return "-"
    return format_duration((datetime.now(UTC) - then).total_seconds())


def _gpus(job: JobOut) -> str:
    per, replicas = job.spec.resources.gpus, job.spec.replicas
    if not per:
        return "-"
    return f"{replicas}×{per:g}" if replicas > 1 else f"{per:g}"


def _print_json(data: BaseModel | Sequence[BaseModel | dict[str, Any]] | dict[str, Any]) -> None:
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, Sequence):
        data = [item.model_dump(mode="json") if isinstance(item, BaseModel) else item for item in data]
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _spec_errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(x) for x in e['loc']) or 'spec'}: {e['msg'].removeprefix('Value error, ')}"
        for e in exc.errors()
    )


# ---------------------------------------------------------------- commands


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


def cmd_up(args: argparse.Namespace) -> int:
    up = platform_module("supervisor.up", "up")
    return asyncio.run(up.run_up(UpOptions.from_args(args), out))


def _say_retry(why: str, seconds: float) -> None:
    err.print(f"{why}; trying again in {seconds:g} s", markup=False)


def cmd_submit(args: argparse.Namespace) -> int:
    try:
        spec = load_spec_file(args.file)
        if args.name:
            spec["name"] = args.name
        checked = JobSpec.model_validate(spec)  # the same validation as the server, before the network
        if (too_large := start_error(checked)) is not None:
            raise SpecError(f"{args.file}: {too_large}")
    except SpecError as exc:
        raise CliError(str(exc)) from None
    except ValidationError as exc:
        raise CliError(f"{args.file}: {_spec_errors(exc)}") from None
    client = Client(args.server, args.token)
    client.on_retry = _say_retry
    accepted = client.submit(spec)  # one Idempotency-Key for this submission and its retries
    if args.json and not args.follow:
        _print_json(accepted)
        return 0
    out.print(f"submitted job [bold]{accepted.job_id}[/] ({accepted.name}), {accepted.state}")
    if not args.follow:
        return 0
    state = follow_job(client, accepted.job_id, out, logs=not args.no_logs)
    job = client.job(accepted.job_id)
    if args.json:
        _print_json(job)
    else:
        out.print(f"job {job.job_id} {state}" + (f": {job.message}" if job.message else ""))
    return 0 if state == JobState.SUCCEEDED else 1


def cmd_ps(args: argparse.Namespace) -> int:
    client = Client(args.server, args.token)
    states = args.state or (None if args.all else in_order(LIVE_STATES))
    page = client.jobs(
        state=states, tenant=args.tenant, limit=args.limit, user=args.user, name=args.name, search=args.search
    )
    jobs = page.items
    if args.json:
        _print_json(jobs)
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
            _age(j.created_at),
            Text(_ps_reason(j)),
        )
    if not jobs:
        out.print("no jobs" + ("" if args.all else " running or waiting (use --all to see finished ones)"))
    else:
        out.print(table)
        if page.total is not None and page.total > len(jobs):
            out.print(f"{len(jobs)} of {page.total} jobs, the newest (--limit for more)")
    return 0


def _ps_reason(job: JobOut) -> str:
    """Why a queued job waits; for others, what `ps` readers need (preemption, cancel, how it ended)."""
    if job.pending:
        return pending_text(job.pending)
    if job.state.terminal:
        return job.message
    if job.cancel_requested:
        return "cancel requested"
    if job.preemption:
        return f"being preempted ({job.preemption.reason})"
    return f"attempt {job.attempt}" if job.attempt > 1 else ""


JOB_ARGUMENT = "the job's id, or a unique prefix of it (4 characters or more)"


def key_value_table(rows: list[tuple[str, str]]) -> Table:
    """Rows of a name in bold and its value, folded: what `why` and `models describe` print."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, Text(v))
    return table


def cmd_describe(args: argparse.Namespace) -> int:
    client = Client(args.server, args.token)
    job = client.job(args.job)
    if args.json:
        _print_json(job)
        return 0
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
        ("Created", f"{job.created_at.isoformat()} ({_age(job.created_at)} ago)"),
    ]
    if spec.idle_timeout is not None or spec.idle_grace is not None:
        rows.insert(-1, ("Idle timeout", _idle_text(spec)))
    if job.pending:
        rows.append(("Waiting", pending_text(job.pending)))
        if job.pending.details:
            rows.append(("Numbers", why.details_text(job.pending.details)))
        rows.append(("Estimated start", why.relative_start(job.pending.estimated_start, datetime.now(UTC))))
    if job.preemption:
        pre = job.preemption
        rows.append(
            ("Preempted", pre.reason + (f" by job {pre.by_job}" if pre.by_job else "") + ", stopping")
        )
    for p in job.placements:
        gpus = ",".join(f"{g.index}" + (f"×{g.fraction:g}" if g.fraction < 1 else "") for g in p.gpus)
        rows.append((f"Replica {p.replica}", p.node + (f" GPU {gpus}" if gpus else "")))
    if job.failure:
        rows.append(("Failure", why.failure_text(job)))
    elif job.message:
        rows.append(("Message", job.message))
    for a in job.attempts:
        rows.append(
            (f"Attempt {a.number}", f"{a.outcome or 'in progress'} · nodes {', '.join(a.nodes) or '-'}")
        )
        rows.extend(("", f"note: {note}") for note in a.notes)
    gpu_use = _gpu_use_text(client, job)
    if gpu_use:
        rows.append(("GPU use", gpu_use))
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for k, v in rows:
        table.add_row(k, Text(v))
    out.print(table)
    if job.failure:
        _print_last_lines(client, job)
    return 0


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
    """The command a job runs, or the model a serve job serves."""
    if spec.serve is not None:
        owner = f" (tenant {spec.serve.tenant}'s)" if spec.serve.tenant else ""
        return "Serves", f"model {spec.serve.job_name}{owner}"
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


def cmd_why(args: argparse.Namespace) -> int:
    job = Client(args.server, args.token).job(args.job)
    now = datetime.now(UTC)
    if args.json:
        _print_json(why.as_dict(job, now))
        return 0
    headline, rows = why.explain(job, now)
    out.print(Text(headline, style="bold"))
    out.print(key_value_table(rows))
    return 0


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


def cmd_events(args: argparse.Namespace) -> int:
    events = Client(args.server, args.token).events(args.job)
    if args.json:
        _print_json(events)
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


def cmd_logs(args: argparse.Namespace) -> int:
    client = Client(args.server, args.token)
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


ALL_ATTEMPTS = "all"


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
            return f"no output: {which} ended ({past.outcome or 'over'}) before it started"
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


def cmd_cancel(args: argparse.Namespace) -> int:
    answer = Client(args.server, args.token).cancel(args.job)
    if args.json:
        _print_json(answer)
    else:
        out.print(f"job {answer.job_id}: {answer.message}")
    return 0


def _when(at: datetime | None, never: str) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC") if at is not None else never


def cmd_tokens_create(args: argparse.Namespace) -> int:
    created = Client(args.server, args.token).create_token(
        tenant=args.tenant,
        user=args.user,
        admin=args.admin,
        expires_in=args.expires_in,
        expires_at=args.expires_at,
    )
    if args.json:
        _print_json(created)
        return 0
    out.print(created.token)
    err.print(
        f"token {created.id} for {created.user or created.tenant} (tenant {created.tenant}"
        f"{', admin' if created.admin else ''}), expires {_when(created.expires, 'never')}: "
        "shown this once, keep it now"
    )
    return 0


def cmd_tokens_ls(args: argparse.Namespace) -> int:
    tokens = Client(args.server, args.token).tokens()
    if args.json:
        _print_json(tokens)
        return 0
    table = Table(box=None, pad_edge=False)
    for column in ("ID", "TENANT", "USER", "ADMIN", "CREATED", "EXPIRES"):
        table.add_column(column)
    now = datetime.now(UTC)
    for t in tokens:
        expires = _when(t.expires, "never")
        if t.expires is not None and t.expires <= now:
            expires += " (expired)"
        created = "settings" if t.inline else _when(t.created, "-")
        table.add_row(t.id, t.tenant, t.user or "-", "yes" if t.admin else "", created, expires)
    out.print(table)
    return 0


def cmd_tokens_revoke(args: argparse.Namespace) -> int:
    Client(args.server, args.token).revoke_token(args.id)
    out.print(f"token {args.id} revoked")
    return 0


# ---------------------------------------------------------------- models (docs/models.md)


def _tensors(specs) -> str:
    return ", ".join(f"{t.name} {t.datatype}[{','.join(map(str, t.shape))}]" for t in specs) or "-"


def cmd_models_publish(args: argparse.Namespace) -> int:
    path = Path(args.path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {args.path}: {exc.strerror or exc}") from None
    client = Client(args.server, args.token)
    client.on_retry = _say_retry
    done = client.publish_model(
        data, name=args.name, version=args.version, public=args.public, tenant=args.tenant
    )
    if args.json:
        _print_json(done)
        return 0
    what = "already published as" if done.duplicate else "published"
    out.print(
        f"{what} [bold]{done.name}[/] version {done.version} (tenant {done.tenant}, {format_size(done.size_bytes)}, "
        f"sha256 {done.sha256[:12]}…)"
    )
    return 0


def cmd_models_ls(args: argparse.Namespace) -> int:
    models = Client(args.server, args.token).models(tenant=args.tenant).items
    if args.json:
        _print_json(models)
        return 0
    if not models:
        out.print("no models (publish one: gpuyard models publish model.onnx --name NAME)")
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("NAME", "TENANT", "LATEST", "VERSIONS", "PUBLIC", "UPDATED"):
        table.add_column(col, no_wrap=True)
    for m in models:
        table.add_row(
            m.name,
            m.tenant,
            str(m.latest or "-"),
            str(m.versions),
            "yes" if m.public else "",
            _age(m.updated_at),
        )
    out.print(table)
    return 0


def cmd_models_describe(args: argparse.Namespace) -> int:
    client = Client(args.server, args.token)
    model = client.model(args.name, tenant=args.tenant)
    if args.json:
        _print_json(model)
        return 0
    rows = [
        ("Model", f"{model.name} (tenant {model.tenant}{', public' if model.public else ''})"),
        ("Latest", str(model.latest or "-")),
        ("Created", f"{model.created_at.isoformat()} ({_age(model.created_at)} ago)"),
    ]
    for v in model.versions:
        by = f"job {v.job_id}" if v.job_id else (v.user or "-")
        rows += [
            (
                f"Version {v.version}",
                f"{format_size(v.size_bytes)} · sha256 {v.sha256} · by {by} · {_when(v.published_at, '-')}",
            ),
            ("  inputs", _tensors(v.inputs)),
            ("  outputs", _tensors(v.outputs)),
            ("  file", v.uri),
        ]
    replicas = client.deployments(model.name, tenant=model.tenant).replicas
    rows.append(("Deployments", f"{len(replicas)} replica(s) not ended" if replicas else "none"))
    rows += _replicas_rows(replicas)
    out.print(key_value_table(rows))
    return 0


def _model_and_version(text: str) -> tuple[str, int | None]:
    """NAME or NAME:VERSION, as `models rm|deploy|undeploy` take it."""
    name, colon, version_text = text.partition(":")
    if not colon:
        return name, None
    if not version_text.isdigit() or int(version_text) < 1:
        raise CliError(f"{text!r}: write NAME or NAME:VERSION (a version is a number from 1)")
    return name, int(version_text)


def _replicas_rows(replicas: list[ReplicaOut]) -> list[tuple[str, str]]:
    """One row per replica of a deployment, as `models describe` and `models deploy` print them."""
    rows = []
    for r in replicas:
        where = f"{r.node}" + (f" GPU {r.gpu_index}" if r.gpu_index is not None else "") if r.node else ""
        share = f"{r.gpus:g} GPU" if r.gpus else "CPU"
        why_not = f" · {pending_text(r.pending)}" if r.pending else ""
        rows.append(
            (
                f"  {r.job_id}",
                f"version {r.version} · {r.state} · {share}{' on ' + where if where else ''}{why_not}",
            )
        )
    return rows


def cmd_models_deploy(args: argparse.Namespace) -> int:
    name, version = _model_and_version(args.model)
    client = Client(args.server, args.token)
    client.on_retry = _say_retry
    done = client.deploy_model(
        name, tenant=args.tenant, version=version, gpus=args.gpus, replicas=args.replicas,
        priority=args.priority, cpus=args.cpus, memory=args.memory,
    )  # fmt: skip
    if args.json:
        _print_json(done)
        return 0
    count = len(done.jobs)
    out.print(
        f"deploying [bold]{done.name}:{done.version}[/]: {count} replica{'s' if count > 1 else ''} queued "
        f"({', '.join(done.job_ids)}); `gpuyard ps` shows them as {done.name}:{done.version}"
    )
    return 0


def cmd_models_undeploy(args: argparse.Namespace) -> int:
    name, version = _model_and_version(args.model)
    done = Client(args.server, args.token).undeploy_model(name, version, tenant=args.tenant)
    if args.json:
        _print_json(done)
        return 0
    count = len(done.cancelled)
    what = f"{done.name}:{version}" if version is not None else done.name
    out.print(
        f"undeploying {what}: {count} replica{'s' if count != 1 else ''} cancelled or stopping "
        f"({', '.join(c.job_id for c in done.cancelled) or '-'})"
    )
    return 0


def cmd_models_rm(args: argparse.Namespace) -> int:
    name, version = _model_and_version(args.model)
    gone = Client(args.server, args.token).delete_model(name, version, tenant=args.tenant)
    if args.json:
        _print_json(gone)
        return 0
    versions = ", ".join(map(str, gone.versions))
    out.print(
        f"removed {gone.name} version{'s' if len(gone.versions) > 1 else ''} {versions} (tenant {gone.tenant})"
    )
    return 0


# ---------------------------------------------------------------- parser


SEVERITY_STYLE = {
    AlertSeverity.CRITICAL: "bold red",
    AlertSeverity.WARNING: "yellow",
    AlertSeverity.INFO: "cyan",
}


def alert_subject(alert: AlertOut) -> str:
    """What an alert is about, in a few words: 'node-1 GPU 3', 'job 4f2a… (vision)', 'node-2'."""
    parts = [alert.node or "", f"GPU {alert.gpu_index}" if alert.gpu_index is not None else ""]
    if alert.job_id:
        parts.append(f"job {alert.job_id}" + (f" ({alert.tenant})" if alert.tenant else ""))
    return " ".join(p for p in parts if p) or alert.alert_id


def cmd_alerts(args: argparse.Namespace) -> int:
    client = Client(args.server, args.token)
    answer = client.alerts(
        state="all" if args.all else "active", kind=args.kind, tenant=args.tenant, limit=args.limit
    )
    alerts = answer.items
    if args.json:
        _print_json(alerts)
        return 0
    if not alerts:
        out.print("no alerts" + ("" if args.all else " active (use --all to see resolved ones)"))
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("SEVERITY", "SINCE", "SUBJECT", "MESSAGE", *(["RESOLVED"] if args.all else [])):
        table.add_column(col, overflow="fold" if col == "MESSAGE" else "ellipsis", no_wrap=col != "MESSAGE")
    for a in alerts:
        row = [
            Text(a.severity.value, style=SEVERITY_STYLE.get(a.severity, "")),
            f"{_age(a.raised_at)} ago",
            Text(alert_subject(a)),
            Text(a.message),
        ]
        if args.all:
            row.append(f"{_age(a.resolved_at)} ago" if a.resolved_at else "active")
        table.add_row(*row)
    out.print(table)
    return 0


def cmd_usage(args: argparse.Namespace) -> int:
    answer = Client(args.server, args.token).usage(since=args.since, by=args.by, tenant=args.tenant)
    if args.json:
        _print_json(answer)
        return 0
    if args.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for r in answer.rows:
            writer.writerow(["" if getattr(r, c) is None else getattr(r, c) for c in CSV_COLUMNS])
        return 0
    print_usage(answer)
    return 0


def print_usage(answer: UsageOut) -> None:
    window = f"{answer.since:%Y-%m-%d %H:%M} to {answer.until:%Y-%m-%d %H:%M} UTC"
    if not answer.rows:
        out.print(f"no GPU use from {window}")
        return
    keys = {"tenant": ["TENANT"], "user": ["TENANT", "USER"], "job": ["TENANT", "USER", "JOB"]}[answer.by]
    table = Table(box=None, pad_edge=False, title=f"GPU-hours from {window}", title_justify="left")
    for col in (*keys, "JOBS", "ALLOCATED", "USED", "WASTE", "USED %"):
        table.add_column(col, justify="right" if col not in keys else "left", no_wrap=True)
    for r in answer.rows:
        share = f"{100 * r.used_gpu_hours / r.allocated_gpu_hours:.0f}%" if r.allocated_gpu_hours else "-"
        key = [r.tenant, r.user or "", r.job_id or ""][: len(keys)]
        table.add_row(
            *key,
            str(r.jobs),
            f"{r.allocated_gpu_hours:.2f}",
            f"{r.used_gpu_hours:.2f}",
            f"{r.waste_gpu_hours:.2f}",
            share,
        )
    out.print(table)


def cmd_top(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise CliError("--interval must be more than 0 seconds")
    client = Client(args.server, args.token)
    if args.json:
        _print_json(client.nodes())
        return 0
    return run_top(client, out, interval=args.interval, once=args.once)


NODE_STATE_STYLE = {"ready": "green", "lost": "red", "cordoned": "yellow", "draining": "yellow"}


def parse_node_target(target: str) -> tuple[str, int | None]:
    """`NODE` or `NODE/GPU` (a GPU's index), as `gpuyard nodes cordon|drain|uncordon` takes it."""
    node, slash, gpu = target.partition("/")
    if not node:
        raise CliError(f"{target!r}: expected NODE or NODE/GPU (e.g. node-a or node-a/1)")
    if not slash:
        return node, None
    if not gpu.isdigit():
        raise CliError(f"{target!r}: the GPU after '/' is its index, a number (e.g. node-a/1)")
    return node, int(gpu)


def cmd_nodes_control(args: argparse.Namespace) -> int:
    node, gpu = parse_node_target(args.target)
    done = Client(args.server, args.token).node_control(node, args.action, gpu=gpu, reason=args.reason)
    if args.json:
        _print_json(done)
        return 0
    what = f"node {node}" if gpu is None else f"GPU {gpu} of node {node}"
    verb = {"cordon": "cordoned", "drain": "drained", "uncordon": "uncordoned"}[args.action]
    follow = {
        "cordon": "nothing new is placed there; running jobs stay",
        "drain": "nothing new is placed there; its running jobs are stopped with their grace period and requeued",
        "uncordon": "open to new jobs again"
        + ("" if gpu is None else "; its unhealthy mark, if any, cleared"),
    }[args.action]
    out.print(f"{what} {verb}: {follow}")
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    nodes = Client(args.server, args.token).nodes()
    if args.json:
        _print_json(nodes)
        return 0
    if not nodes:
        out.print("no nodes (no executor has announced one yet)")
        return 0
    print_nodes(nodes)
    return 0


def print_nodes(nodes: list[NodeOut]) -> None:
    """One row per GPU: the node's state on its first GPU's row, each GPU's health, cordon and utilization."""
    table = Table(box=None, pad_edge=False)
    for col in ("NODE", "STATE", "GPU", "MODEL", "HEALTH", "CORDON", "UTIL", "MEMORY", "HOLDERS"):
        table.add_column(col, no_wrap=col != "HEALTH", overflow="fold" if col == "HEALTH" else "ellipsis")
    for n in nodes:
        state = Text(n.state.value, style=NODE_STATE_STYLE.get(n.state.value, ""))
        if not n.gpus:
            table.add_row(n.node, state, "-", "", "", "", "", "", "")
        for k, g in enumerate(n.gpus):
            health = (
                Text("healthy", style="green")
                if g.healthy
                else Text(f"unhealthy: {g.unhealthy_reason or '?'}", style="bold red")
            )
            util = "-" if g.utilization_pct is None else f"{g.utilization_pct:.0f}%"
            memory = (
                "-"
                if g.memory_used_bytes is None
                else f"{g.memory_used_bytes / 2**30:.1f}/{g.memory_bytes / 2**30:.0f} GiB"
            )
            holders = ", ".join("other" if h.other else f"{h.job_id}" for h in g.holders) or "-"
            table.add_row(
                n.node if k == 0 else "",
                state if k == 0 else "",
                str(g.index),
                g.model,
                health,
                "cordoned" if g.cordoned else "-",
                util,
                memory,
                holders,
            )
    out.print(table)


def _data_dir(args: argparse.Namespace) -> Path:
    return Path(args.data_dir) if args.data_dir else CommonSettings().data_dir


def cmd_backup(args: argparse.Namespace) -> int:
    backup = platform_module("supervisor.backup", "backup")
    try:
        done = backup.backup(_data_dir(args), Path(args.archive))
    except backup.BackupError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        _print_json({"archive": args.archive, "files": done.files, "jobs": done.jobs, "events": done.events})
    else:
        out.print(
            f"backed up {done.jobs} jobs, {done.events} events ({', '.join(done.files)}) to {args.archive}"
        )
    return 0


def cmd_bus_user(args: argparse.Namespace) -> int:
    busconfig = platform_module("supervisor.busconfig", "admin bus-user")
    try:
        made = busconfig.add_tenant_integrator(_data_dir(args), args.tenant)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        _print_json(
            {
                "tenant": made.tenant,
                "credentials": str(made.credentials),
                "config": str(made.config),
                "reloaded_pid": made.reloaded,
            }
        )
        return 0
    out.print(
        f"bus user for tenant {made.tenant}'s job events (job.*.{made.tenant}, read-only): {made.credentials}",
    )
    if made.reloaded is not None:
        out.print(f"the running NATS server (pid {made.reloaded}) reloaded {made.config}")
    else:
        out.print("no running NATS server: the user takes effect at the next `gpuyard up`")
    return 0


def cmd_context_ls(args: argparse.Namespace) -> int:
    saved = contexts.load()
    if args.json:
        _print_json(
            [
                {
                    "name": c.name,
                    "server": c.server,
                    "data_dir": c.data_dir or None,
                    "current": c.name == saved.current,
                }
                for c in saved.entries.values()
            ]
        )
        return 0
    if not saved.entries:
        out.print(
            f"no contexts in {contexts.config_path()}: `gpuyard up` saves one for each platform it runs"
        )
        return 0
    table = Table(box=None, pad_edge=False)
    for col in ("CURRENT", "NAME", "SERVER", "DATA DIR"):
        table.add_column(col, no_wrap=True)
    for c in saved.entries.values():
        table.add_row("*" if c.name == saved.current else "", c.name, c.server, c.data_dir or "(unknown)")
    out.print(table)
    chosen = ClientSettings().context
    if chosen and chosen != saved.current:
        out.print(f"GPUYARD_CONTEXT picks {chosen!r} for the commands of this shell")
    return 0


def cmd_context_use(args: argparse.Namespace) -> int:
    with contexts.editing() as saved:
        chosen = _context(saved, args.name)
        saved.current = chosen.name
    out.print(f"now talking to {chosen.server} (context {chosen.name!r})")
    return 0


def cmd_context_rm(args: argparse.Namespace) -> int:
    with contexts.editing() as saved:
        gone = saved.entries.pop(_context(saved, args.name).name)
        if saved.current == gone.name:
            saved.current = None
    out.print(
        f"forgot context {gone.name!r} ({gone.server}); its token stays valid on its platform until the next "
        "`gpuyard up` there replaces it"
        + ("; no context is current now: `gpuyard context use NAME`" if saved.current is None else "")
    )
    return 0


def _context(saved: contexts.Contexts, name: str) -> contexts.Context:
    try:
        return saved.pick(name)
    except contexts.ContextError as exc:
        raise CliError(str(exc)) from None


def cmd_restore(args: argparse.Namespace) -> int:
    backup = platform_module("supervisor.backup", "restore")
    try:
        done = backup.restore(Path(args.archive), Path(args.data_dir))
    except backup.BackupError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        _print_json(
            {"data_dir": args.data_dir, "files": done.files, "jobs": done.jobs, "events": done.events}
        )
    else:
        out.print(
            f"restored {done.jobs} jobs, {done.events} events into {args.data_dir}; "
            f"start it with: gpuyard up --data-dir {args.data_dir}"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
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

    parser = argparse.ArgumentParser(prog="gpuyard", description="GPUYARD: a GPU training platform.")
    parser.add_argument("--version", action="version", version=f"gpuyard {VERSION}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = sub.add_parser("up", help="run the whole platform on this machine")
    add_up_arguments(up)
    up.set_defaults(func=cmd_up)

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

    for name, func, text in (
        ("describe", cmd_describe, "show one job"),
        ("events", cmd_events, "a job's events, in order"),
        ("cancel", cmd_cancel, "cancel a job"),
    ):
        p = sub.add_parser(name, help=text, parents=[common])
        p.add_argument("job", help=JOB_ARGUMENT)
        p.set_defaults(func=func)

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

    why_cmd = sub.add_parser(
        "why", help="why a job waits (reason, numbers, queue position, estimated start)", parents=[common]
    )
    why_cmd.add_argument("job", help=JOB_ARGUMENT)
    why_cmd.set_defaults(func=cmd_why)

    alerts = sub.add_parser(
        "alerts", help="alerts active now (--all: and resolved ones), newest first", parents=[common]
    )
    alerts.add_argument("-a", "--all", action="store_true", help="include resolved alerts")
    alerts.add_argument("--kind", help="only this rule's alerts: gpu_idle, gpu_temperature, node_lost…")
    alerts.add_argument("--tenant", help="only this tenant's (admins; a tenant's token sees its own)")
    alerts.add_argument("--limit", type=int, default=50, help="at most this many alerts (50)")
    alerts.set_defaults(func=cmd_alerts)

    usage = sub.add_parser(
        "usage", help="GPU-hours allocated, used and wasted, per tenant, user or job", parents=[common]
    )
    usage.add_argument("--since", default="7d", help="how far back: 7d, 24h, 90m (7d)")
    usage.add_argument(
        "--by", choices=("tenant", "user", "job"), default="tenant", help="one row per (tenant)"
    )
    usage.add_argument("--tenant", help="only this tenant's (admins; a tenant's token sees its own)")
    usage.add_argument("--csv", action="store_true", help="CSV, one row per line, for a spreadsheet")
    usage.set_defaults(func=cmd_usage)

    top = sub.add_parser("top", help="a live view of the cluster's GPUs (like nvtop)", parents=[common])
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=2.0, help="seconds between two frames (2)")
    top.set_defaults(func=cmd_top)

    nodes = sub.add_parser(
        "nodes", help="the nodes: state, each GPU's health, cordon and utilization", parents=[common]
    )
    nodes.set_defaults(func=cmd_nodes)
    nodes_sub = nodes.add_subparsers(dest="action", required=False, metavar="ACTION")
    for action, text in (
        ("cordon", "place nothing new on a node or GPU; running jobs stay (admin)"),
        ("drain", "cordon, and stop and requeue the running jobs there (admin)"),
        ("uncordon", "undo a cordon or drain, and clear an unhealthy mark (admin)"),
    ):
        p = nodes_sub.add_parser(action, help=text, parents=[common])
        p.add_argument("target", metavar="NODE[/GPU]", help="a node, or one GPU of it by index (node-a/1)")
        p.add_argument("--reason", default="", help="why, recorded with the event")
        p.set_defaults(func=cmd_nodes_control)

    models = sub.add_parser("models", help="publish, list, describe, deploy and remove models (ONNX)")
    models_sub = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    owner = argparse.ArgumentParser(add_help=False)
    owner.add_argument("--tenant", help="the tenant that owns the model (default: your token's)")
    publish = models_sub.add_parser(
        "publish", help="publish an ONNX file as a model's next version", parents=[common, owner]
    )
    publish.add_argument("path", metavar="PATH", help="the ONNX file")
    publish.add_argument("--name", required=True, help="the model's name (lowercase letters, digits, '-')")
    publish.add_argument("--version", type=int, help="publish as this version (default: the next one)")
    publish.add_argument("--public", action="store_true", help="every tenant may see and use it")
    publish.set_defaults(func=cmd_models_publish)
    models_sub.add_parser(
        "ls", help="your tenant's models and the public ones", parents=[common, owner]
    ).set_defaults(func=cmd_models_ls)
    describe_model = models_sub.add_parser(
        "describe", help="a model's versions, signatures and files", parents=[common, owner]
    )
    describe_model.add_argument("name", metavar="NAME")
    describe_model.set_defaults(func=cmd_models_describe)
    deploy = models_sub.add_parser(
        "deploy",
        help="serve a model version (default: the newest): replicas placed like jobs, with their GPU share",
        parents=[common, owner],
    )
    deploy.add_argument("model", metavar="NAME[:VERSION]")
    deploy.add_argument("--gpus", type=float, help="each replica's GPUs: a share of one (0.25) or whole ones")
    deploy.add_argument("--replicas", type=int, help="how many replicas (1)")
    deploy.add_argument("--priority", help=f"priority class: {', '.join(PRIORITY_CLASSES)} (normal)")
    deploy.add_argument("--cpus", type=float, help="each replica's CPUs (1)")
    deploy.add_argument("--memory", help="each replica's host memory, e.g. 4GB (2GB)")
    deploy.set_defaults(func=cmd_models_deploy)
    undeploy = models_sub.add_parser(
        "undeploy",
        help="stop serving a model (or one version): cancels its replicas",
        parents=[common, owner],
    )
    undeploy.add_argument("model", metavar="NAME[:VERSION]")
    undeploy.set_defaults(func=cmd_models_undeploy)
    rm = models_sub.add_parser("rm", help="remove a model, or one version of it", parents=[common, owner])
    rm.add_argument("model", metavar="NAME[:VERSION]")
    rm.set_defaults(func=cmd_models_rm)

    admin = sub.add_parser("admin", help="platform administration (admin token)")
    admin_sub = admin.add_subparsers(dest="area", required=True, metavar="AREA")
    tokens = admin_sub.add_parser("tokens", help="create, list and revoke bearer tokens")
    tokens_sub = tokens.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = tokens_sub.add_parser("create", help="a new token, printed once", parents=[common])
    create.add_argument("--tenant", required=True)
    create.add_argument("--user", default="")
    create.add_argument("--admin", action="store_true", help="sees every tenant and manages tokens")
    expiry = create.add_mutually_exclusive_group()
    expiry.add_argument("--expires-in", metavar="DURATION", help="e.g. 30d, 12h, 3600")
    expiry.add_argument("--expires-at", metavar="TIME", help="ISO 8601 with its zone, e.g. 2027-01-31T00:00Z")
    create.set_defaults(func=cmd_tokens_create)
    tokens_sub.add_parser("ls", help="list tokens (never the tokens)", parents=[common]).set_defaults(
        func=cmd_tokens_ls
    )
    revoke = tokens_sub.add_parser("revoke", help="revoke a token by its id", parents=[common])
    revoke.add_argument("id")
    revoke.set_defaults(func=cmd_tokens_revoke)

    save = admin_sub.add_parser(
        "backup", help="copy the stores, tokens and bus credentials to one archive, while the platform runs"
    )
    save.add_argument("archive", metavar="OUT.tar.gz")
    save.add_argument(
        "--data-dir",
        help="the platform's data directory (default: GPUYARD_DATA_DIR or ~/.local/share/gpuyard)",
    )
    save.add_argument("--json", action="store_true", help="machine-readable output")
    save.set_defaults(func=cmd_backup)
    bus_user = admin_sub.add_parser(
        "bus-user", help="a read-only NATS user for one tenant's job events (for its integrations)"
    )
    bus_user.add_argument("--tenant", required=True, help="the tenant whose job events it may read")
    bus_user.add_argument(
        "--data-dir",
        help="the platform's data directory (default: GPUYARD_DATA_DIR or ~/.local/share/gpuyard)",
    )
    bus_user.add_argument("--json", action="store_true", help="machine-readable output")
    bus_user.set_defaults(func=cmd_bus_user)
    load = admin_sub.add_parser("restore", help="unpack a backup into a new, empty data directory")
    load.add_argument("archive", metavar="IN.tar.gz")
    load.add_argument("--data-dir", required=True, help="the new data directory (empty or absent)")
    load.add_argument("--json", action="store_true", help="machine-readable output")
    load.set_defaults(func=cmd_restore)

    context = sub.add_parser(
        "context",
        help="the platforms this CLI knows (one context each, saved by `gpuyard up`) and the current one",
    )
    context_sub = context.add_subparsers(dest="action", required=True, metavar="ACTION")
    context_ls = context_sub.add_parser(
        "ls", help="each context: name, server, data dir; * marks the current one"
    )
    context_ls.add_argument("--json", action="store_true", help="machine-readable output")
    context_ls.set_defaults(func=cmd_context_ls)
    use = context_sub.add_parser("use", help="make a context the current one: commands talk to its platform")
    use.add_argument("name", metavar="NAME")
    use.set_defaults(func=cmd_context_use)
    forget = context_sub.add_parser("rm", help="forget a context (its platform and token stay as they are)")
    forget.add_argument("name", metavar="NAME")
    forget.set_defaults(func=cmd_context_rm)

    sub.add_parser(  # listed here for `gpuyard --help`; main() hands `gpuyard sim ARGS` to the simulator
        "sim",
        help="replay a trace through the scheduler, one result row per policy (gpuyard sim --help)",
        add_help=False,
    )
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


if __name__ == "__main__":
    sys.exit(main())
