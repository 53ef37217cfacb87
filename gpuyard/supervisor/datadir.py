"""A platform's data dir made ready by `gpuyard up` before it starts any process (`prepare`): locked against a
second `gpuyard up`, its ports and disk checked, its logs folder, its admin token (the first the CLI saved that
its tokens file still takes) saved as the CLI's current context, the secret that signs jobs' publish tokens,
and the files a Prometheus reads."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from gpuyard import contexts
from gpuyard.shared.auth.jobtokens import JobTokenError, ensure_secret, secret_path
from gpuyard.shared.auth.secretfile import SecretFileError
from gpuyard.shared.auth.secretfile import ensure_secret as ensure_secret_file
from gpuyard.shared.auth.tokens import Tokens, TokensFixed
from gpuyard.shared.settings.gateway import GATEWAY_TOKEN_FILE, GATEWAY_TOKEN_WHAT
from gpuyard.shared.settings.names import env_name
from gpuyard.supervisor.busconfig import LOCK_FILE
from gpuyard.supervisor.diskroom import jetstream_room
from gpuyard.supervisor.ports import conflict
from gpuyard.supervisor.scrapeconfig import write_prometheus_files

if TYPE_CHECKING:
    from gpuyard.supervisor.plan import Plan

TOKENS_FILE = "tokens.json"
LOGS = "logs"


@dataclass
class Prepared:
    """What `prepare` made ready, for the banner and the supervision."""

    lock: TextIO
    """Held while `gpuyard up` runs: its exclusive lock on the data dir."""
    log_dir: Path
    server_url: str
    admin_token: str
    context: contexts.Context
    config_path: Path
    """The CLI's contexts file, where `context` is saved."""
    targets_path: Path
    scrape: Path | None
    """The Prometheus scrape configuration (None without a monitor)."""


def prepare(platform: Plan) -> Prepared:
    """The data dir made ready, in this order: nothing is written past a check that fails (one line each)."""
    data_dir = platform.data_dir
    lock = lock_data_dir(data_dir)
    # Every port, before anything starts: one line now, not a service crash-looping behind the banner.
    if (problem := conflict(platform.ports)) is not None:
        raise SystemExit(problem)
    # JetStream's reservation, likewise: on a disk with less room, every service would crash-loop at its start.
    if (problem := jetstream_room(data_dir, platform.submit.stream_max_bytes)) is not None:
        raise SystemExit(problem)
    log_dir = make_log_dir(data_dir)
    admin_token, _ = ensure_admin_token(data_dir, contexts.load().saved_tokens(data_dir))
    ensure_publish_secret(data_dir, platform.submit.publish_secret_file)
    ensure_gateway_token(data_dir)
    server_url = f"http://{platform.nats_host}:{platform.submit.submit_port}"
    context, config_path = save_context(data_dir, server_url, admin_token)
    targets_path, scrape = write_prometheus_files(platform)
    return Prepared(lock, log_dir, server_url, admin_token, context, config_path, targets_path, scrape)


def lock_data_dir(data_dir: Path) -> TextIO:
    """The data dir (0700, made when missing), locked for this `gpuyard up` alone: its lock file, held open."""
    data_dir.mkdir(parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    lock = os.fdopen(os.open(data_dir / LOCK_FILE, os.O_WRONLY | os.O_CREAT, 0o600), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit(f"another `gpuyard up` is already running on {data_dir}") from None
    return lock


def make_log_dir(data_dir: Path) -> Path:
    """`<data dir>/logs` (0700), where each process's output is kept."""
    log_dir = data_dir / LOGS
    log_dir.mkdir(exist_ok=True)
    log_dir.chmod(0o700)
    return log_dir


def ensure_admin_token(data_dir: Path, saved: Sequence[str]) -> tuple[str, bool]:
    """The data dir's admin token for the CLI, and whether it is new: the first of the tokens the CLI saved
    (`saved`, this data dir's context's first) that its tokens file still takes as an admin's, else a new one;
    the one before it, if any, is revoked (`Tokens.keep_up_admin`)."""
    try:
        return Tokens(data_dir / TOKENS_FILE).keep_up_admin(saved)
    except TokensFixed as exc:
        raise SystemExit(f"the admin token: {exc}") from None


def ensure_publish_secret(data_dir: Path, secret_file: Path | None) -> None:
    """The secret that signs jobs' publish tokens, made when missing: the submit service and the executors read
    it (docs/models.md)."""
    try:
        ensure_secret(secret_path(data_dir, secret_file))
    except (OSError, JobTokenError) as exc:
        raise SystemExit(f"the publish secret: {exc}") from None


def ensure_gateway_token(data_dir: Path) -> None:
    """The token the submit service sends to the executors' gateways (exec, shell, ports), made when missing
    (`gateway_token_file` may name another, which its owner makes)."""
    named = os.environ.get(env_name("gateway_token_file"))
    try:
        ensure_secret_file(Path(named) if named else data_dir / GATEWAY_TOKEN_FILE, GATEWAY_TOKEN_WHAT)
    except (OSError, SecretFileError) as exc:
        raise SystemExit(f"the gateway token: {exc}") from None


def save_context(data_dir: Path, server: str, token: str) -> tuple[contexts.Context, Path]:
    """The CLI's context of `data_dir` names `server` and `token` and is current (gpuyard/contexts.py)."""
    try:
        with contexts.editing() as saved:
            context = saved.record(data_dir, server, token)
    except OSError as exc:
        raise SystemExit(f"the CLI's contexts cannot be saved in {contexts.config_path()}: {exc}") from None
    return context, contexts.config_path()
