"""`gpuyard models publish|ls|describe|deploy|undeploy|rm`: ONNX models, their versions and their deployments
(docs/models.md)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from gpuyard.cli.common import CliError, age, api_client, key_value_table, out, print_json, when
from gpuyard.shared.contracts.api.jobs import pending_text
from gpuyard.shared.contracts.api.models import ReplicaOut
from gpuyard.shared.contracts.jobspec import PRIORITY_CLASSES
from gpuyard.shared.contracts.units import format_size

MODEL_ARGUMENT = "NAME[:VERSION]"


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    models = sub.add_parser("models", help="publish, list, describe, deploy and remove models (ONNX)")
    models_sub = models.add_subparsers(dest="action", required=True, metavar="ACTION")
    owner = argparse.ArgumentParser(add_help=False)
    owner.add_argument("--tenant", help="the tenant that owns the model (default: your token's)")
    parents = [common, owner]
    publish = models_sub.add_parser(
        "publish", help="publish an ONNX file as a model's next version", parents=parents
    )
    publish.add_argument("path", metavar="PATH", help="the ONNX file")
    publish.add_argument("--name", required=True, help="the model's name (lowercase letters, digits, '-')")
    publish.add_argument("--version", type=int, help="publish as this version (default: the next one)")
    publish.add_argument("--public", action="store_true", help="every tenant may see and use it")
    publish.set_defaults(func=cmd_models_publish)
    models_sub.add_parser(
        "ls", help="your tenant's models and the public ones", parents=parents
    ).set_defaults(func=cmd_models_ls)
    describe = models_sub.add_parser(
        "describe", help="a model's versions, signatures and files", parents=parents
    )
    describe.add_argument("name", metavar="NAME")
    describe.set_defaults(func=cmd_models_describe)
    _add_deploy(models_sub, parents)
    undeploy = models_sub.add_parser(
        "undeploy",
        help="stop serving a model (or one version): cancels its replicas",
        parents=parents,
    )
    undeploy.add_argument("model", metavar=MODEL_ARGUMENT)
    undeploy.set_defaults(func=cmd_models_undeploy)
    rm = models_sub.add_parser("rm", help="remove a model, or one version of it", parents=parents)
    rm.add_argument("model", metavar=MODEL_ARGUMENT)
    rm.set_defaults(func=cmd_models_rm)


def _add_deploy(models_sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:
    deploy = models_sub.add_parser(
        "deploy",
        help="serve a model version (default: the newest): replicas placed like jobs, with their GPU share",
        parents=parents,
    )
    deploy.add_argument("model", metavar=MODEL_ARGUMENT)
    deploy.add_argument("--gpus", type=float, help="each replica's GPUs: a share of one (0.25) or whole ones")
    deploy.add_argument("--replicas", type=int, help="how many replicas (1)")
    deploy.add_argument("--priority", help=f"priority class: {', '.join(PRIORITY_CLASSES)} (normal)")
    deploy.add_argument("--cpus", type=float, help="each replica's CPUs (1)")
    deploy.add_argument("--memory", help="each replica's host memory, e.g. 4GB (2GB)")
    deploy.set_defaults(func=cmd_models_deploy)


# ---------------------------------------------------------------- publish, ls, describe


def cmd_models_publish(args: argparse.Namespace) -> int:
    path = Path(args.path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {args.path}: {exc.strerror or exc}") from None
    client = api_client(args, say_retries=True)
    done = client.publish_model(
        data, name=args.name, version=args.version, public=args.public, tenant=args.tenant
    )
    if args.json:
        print_json(done)
        return 0
    what = "already published as" if done.duplicate else "published"
    out.print(
        f"{what} [bold]{done.name}[/] version {done.version} (tenant {done.tenant}, {format_size(done.size_bytes)}, "
        f"sha256 {done.sha256[:12]}…)"
    )
    return 0


def cmd_models_ls(args: argparse.Namespace) -> int:
    models = api_client(args).models(tenant=args.tenant).items
    if args.json:
        print_json(models)
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
            age(m.updated_at),
        )
    out.print(table)
    return 0


def cmd_models_describe(args: argparse.Namespace) -> int:
    client = api_client(args)
    model = client.model(args.name, tenant=args.tenant)
    if args.json:
        print_json(model)
        return 0
    rows = [
        ("Model", f"{model.name} (tenant {model.tenant}{', public' if model.public else ''})"),
        ("Latest", str(model.latest or "-")),
        ("Created", f"{model.created_at.isoformat()} ({age(model.created_at)} ago)"),
    ]
    for v in model.versions:
        by = f"job {v.job_id}" if v.job_id else (v.user or "-")
        rows += [
            (
                f"Version {v.version}",
                f"{format_size(v.size_bytes)} · sha256 {v.sha256} · by {by} · {when(v.published_at, '-')}",
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


def _tensors(specs) -> str:
    return ", ".join(f"{t.name} {t.datatype}[{','.join(map(str, t.shape))}]" for t in specs) or "-"


def _replicas_rows(replicas: list[ReplicaOut]) -> list[tuple[str, str]]:
    """One row per replica of a deployment, as `models describe` prints them."""
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


# ---------------------------------------------------------------- deploy, undeploy, rm


def _model_and_version(text: str) -> tuple[str, int | None]:
    """NAME or NAME:VERSION, as `models rm|deploy|undeploy` take it."""
    name, colon, version_text = text.partition(":")
    if not colon:
        return name, None
    if not version_text.isdigit() or int(version_text) < 1:
        raise CliError(f"{text!r}: write NAME or NAME:VERSION (a version is a number from 1)")
    return name, int(version_text)


def cmd_models_deploy(args: argparse.Namespace) -> int:
    name, version = _model_and_version(args.model)
    done = api_client(args, say_retries=True).deploy_model(
        name, tenant=args.tenant, version=version, gpus=args.gpus, replicas=args.replicas,
        priority=args.priority, cpus=args.cpus, memory=args.memory,
    )  # fmt: skip
    if args.json:
        print_json(done)
        return 0
    count = len(done.jobs)
    out.print(
        f"deploying [bold]{done.name}:{done.version}[/]: {count} replica{'s' if count > 1 else ''} queued "
        f"({', '.join(done.job_ids)}); `gpuyard ps` shows them as {done.name}:{done.version}"
    )
    return 0


def cmd_models_undeploy(args: argparse.Namespace) -> int:
    name, version = _model_and_version(args.model)
    done = api_client(args).undeploy_model(name, version, tenant=args.tenant)
    if args.json:
        print_json(done)
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
    gone = api_client(args).delete_model(name, version, tenant=args.tenant)
    if args.json:
        print_json(gone)
        return 0
    versions = ", ".join(map(str, gone.versions))
    out.print(
        f"removed {gone.name} version{'s' if len(gone.versions) > 1 else ''} {versions} (tenant {gone.tenant})"
    )
    return 0
