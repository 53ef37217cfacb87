"""What every service's settings share (data dir, bus, store, log level…), the types their fields use, and the reading of a service's settings from its flags and GPUYARD_* variables, flags first."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Annotated, Any, Literal, NoReturn, TypeVar

from pydantic import BeforeValidator, Field, ValidationError
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from gpuyard.shared.contracts.units import parse_duration, parse_size

ENV_PREFIX = "GPUYARD_"


def log_store_url(store_url: str) -> str:
    """The log store beside an event store: `logs.db` next to the SQLite file, or the same MongoDB database."""
    if store_url.startswith("sqlite:///"):
        return f"sqlite:///{Path(store_url.removeprefix('sqlite:///')).with_name('logs.db')}"
    return store_url


def default_data_dir() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "gpuyard"


def _tenant_numbers(value: object) -> object:
    """'vision=8,nlp=4' (or a JSON object, or a dict) -> {'vision': 8.0, 'nlp': 4.0}."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("{"):
        return json.loads(text)
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, number = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"expected tenant=number, got {item!r}")
        pairs[name.strip()] = number.strip()
    return pairs


TenantNumbers = Annotated[dict[str, float], NoDecode, BeforeValidator(_tenant_numbers)]


def _tenant_durations(value: object) -> object:
    """'vision=30m,*=2h' (or a JSON object, or a dict) -> {'vision': 1800.0, '*': 7200.0}; 0 or 'off': off."""
    pairs = _tenant_numbers(value)
    if not isinstance(pairs, dict):
        return pairs
    durations = {}
    for name, text in pairs.items():
        off = str(text).strip().lower() in ("0", "off", "never")
        durations[name] = 0.0 if off else parse_duration(text)
    return durations


TenantDurations = Annotated[dict[str, float], NoDecode, BeforeValidator(_tenant_durations)]
"""A duration per tenant, `vision=30m,nlp=1h` (`*`: every other tenant's)."""


def _tenant_sizes(value: object) -> object:
    """'vision=500GB,*=100GB' (or a JSON object, or a dict) -> {'vision': 5e11, '*': 1e11}; 0: no limit."""
    pairs = _tenant_numbers(value)
    if not isinstance(pairs, dict):
        return pairs
    return {name: parse_size(text) for name, text in pairs.items()}


TenantSizes = Annotated[dict[str, int], NoDecode, BeforeValidator(_tenant_sizes)]
"""A size per tenant, `vision=500GB,*=100GB` (`*`: every other tenant's)."""


def _keep_for(value: Any) -> object:
    """'7d', '12h', a number of seconds; '0' or 'never': kept for ever (0)."""
    if isinstance(value, str) and value.strip().lower() in ("never", "0", "forever", ""):
        return 0.0
    if isinstance(value, int | float) and value == 0:
        return 0.0
    return parse_duration(value)


def comma_list(value: object) -> object:
    """'a,b' (or a JSON list, or a list) -> ['a', 'b']; empty items are dropped."""
    if not isinstance(value, str):
        return value
    text = value.strip()
    if text.startswith("["):
        return json.loads(text)
    return [item.strip() for item in text.split(",") if item.strip()]


KeepFor = Annotated[float, BeforeValidator(_keep_for)]


Duration = Annotated[float, BeforeValidator(parse_duration)]  # '7d', '12h' or a number of seconds


Size = Annotated[int, BeforeValidator(parse_size)]  # '64MiB', '2GB' or a number of bytes


def written(default: str) -> Any:
    """A Size, Duration or KeepFor field's default as one writes it ('1GiB', '7d'): settings validate their
    defaults, so the field's validator parses it like a value from the environment, and the docs show it as
    written. (Typed Any: `Field("1GiB")` would type the field str, where it holds the parsed int or float.)"""
    return default


Port = Annotated[int, Field(ge=1, le=65535)]
"""A TCP port to listen on: a bad one (99999, -1) is refused at start, never wrapped into some other port."""


PortOrAny = Annotated[int, Field(ge=0, le=65535)]
"""A TCP port, or 0 where the setting's description says that it picks any free one."""


EXIT_REFUSED = 2
"""A service's exit status when it refuses its configuration (settings, credentials, job users): a supervisor
does not restart it (`gpuyard up` stops with its reason); any other failure is 1, and worth a restart."""


class CommonSettings(BaseSettings):
    """Settings every service shares."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        extra="ignore",
        cli_kebab_case=True,  # --cycle-interval for cycle_interval
        cli_exit_on_error=False,  # settings_from_argv turns every error into one line
        cli_implicit_flags=False,  # booleans take a value: --preemption false
    )

    nats_url: str = Field("nats://127.0.0.1:4222", description="One or more NATS URLs, comma-separated.")
    nats_credentials: Path | None = Field(
        None,
        description='File with this service\'s NATS user and password, `{"user": …, "password": …}`, mode 0600 '
        "(`gpuyard up` writes one per service in <data dir>/bus/); empty: connect without a user.",
    )
    nats_tls_ca: Path | None = Field(
        None,
        description="CA certificate (PEM) that signed the NATS servers' certificates: the connection is then TLS "
        "(see docs/operations.md, the bus).",
    )
    store: str = Field(
        "",
        description="Event store: sqlite:///path/events.db (default: events.db in the data dir) or "
        "mongodb://h1,h2,h3/gpuyard?replicaSet=rs0.",
    )
    store_durable_commits: bool = Field(
        False,
        description="SQLite store: each commit waits until it is on disk (synchronous=FULL), so it survives a "
        "power loss; off, a commit survives the process's crash but the last ones may not survive a power loss "
        "(the submit service has it on: its 202 promises the job is kept).",
    )
    log_store: str = Field(
        "",
        description="Where jobs' output is kept for the API to read from any node: sqlite:///path/logs.db "
        "(default: logs.db beside a SQLite event store) or mongodb://… (default: the event store's database).",
    )
    data_dir: Path = Field(
        default_factory=default_data_dir,
        description="Where the event store, job logs and working directories are kept "
        "(default: $XDG_DATA_HOME/gpuyard, else ~/.local/share/gpuyard).",
    )
    instance: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}",
        description="This process's name in events and heartbeats (default: hostname-pid).",
    )
    health_host: str = Field("127.0.0.1", description="Address of /healthz and /readyz.")
    health_port: PortOrAny = Field(
        0,
        description="Port of /healthz and /readyz; 0 picks a free one. `gpuyard up` gives each process its own, "
        "below the kernel's ephemeral range (where a port bound to 0 could take one the user chose), unless "
        "this is set.",
    )
    log_level: str = Field("INFO", description="DEBUG, INFO, WARNING or ERROR.")
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="uvloop where installed; asyncio runs the service on the standard event loop."
    )
    max_deliver: int = Field(
        5, description="Deliveries of one event before it goes to the dead-letter stream."
    )
    stream_replicas: int = Field(
        1, ge=1, le=5, description="Replicas of each JetStream stream and KV bucket: 3 on a 3-server cluster."
    )
    retention: KeepFor = Field(
        written("7d"),
        description="How long a finished job's working directories, node log files, shipped output and "
        "intermediate events are kept after it ends (`7d`, `12h`); its state and first and last events are "
        "kept for good. `never` (or 0): everything is kept.",
    )
    retention_interval: float = Field(
        3600.0, gt=0, description="Seconds between retention sweeps (the executor's, the submit service's)."
    )
    stream_max_bytes: Size = Field(
        written("1GiB"),
        description="Most bytes each JetStream stream keeps; beyond it the oldest messages go (the event "
        "store keeps every job; see docs/operations.md#jetstream-limits).",
    )
    stream_max_msgs: int = Field(
        1_000_000,
        ge=-1,
        description="Most messages each JetStream stream keeps (-1: no limit); the oldest go.",
    )
    model_store: str = Field(
        "",
        description="Where published models are kept: a directory, or an fsspec URL such as "
        "s3://bucket/prefix (needs the `s3` extra; credentials and endpoint from the standard AWS variables or "
        "~/.aws, e.g. AWS_ENDPOINT_URL for MinIO or another S3-compatible store); default: models/ in the data "
        "dir. See docs/models.md.",
    )
    publish_secret_file: Path | None = Field(
        None,
        description="File of the secret that signs jobs' publish tokens, shared by the submit service and "
        "every executor (mode 0600; `gpuyard up` makes one); default: secrets/publish.key in the data dir.",
    )
    supervisor_pid: int = Field(
        0,
        ge=0,
        description="Set by `gpuyard up`: the supervisor's pid; once it is no longer the service's parent, the "
        "service stops, and is ended if its stop is stuck. 0: not supervised.",
    )
    service_metrics_host: str = Field(
        "127.0.0.1", description="Address of the service's own Prometheus /metrics (service_metrics_port)."
    )
    service_metrics_port: PortOrAny | None = Field(
        None,
        description="Port of the service's own Prometheus /metrics: its process figures and what its bus "
        'consumers handle (docs/operations.md, "Metrics of each service"); 0 picks a free one; not set: no '
        "port of its own (the submit API, the serving API and the monitor's /metrics serve them too). "
        "`gpuyard up` gives the scheduler and each executor one.",
    )
    consumer_lag_interval: Duration = Field(
        5.0,
        gt=0,
        description="Seconds between two reads of the backlog of the service's JetStream consumers (the "
        "consumer figures of /metrics).",
    )

    @property
    def log_store_url(self) -> str:
        return self.log_store or log_store_url(self.store_url)

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{self.data_dir / 'events.db'}"

    @property
    def model_store_url(self) -> str:
        return self.model_store or str(self.data_dir / "models")

    @property
    def nats_servers(self) -> list[str]:
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]


S = TypeVar("S", bound=CommonSettings)


def settings_from_argv(settings_cls: type[S], argv: list[str] | None, prog: str) -> S:
    """The settings of a service from its flags (argv; None: sys.argv[1:]) and GPUYARD_* variables, flags
    first. A bad value ends the process with one line naming the setting, and exit status 2."""
    try:
        return settings_cls(
            _cli_parse_args=sys.argv[1:] if argv is None else argv,
            _cli_prog_name=prog,
        )
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
        )
        _refuse(prog, f"invalid settings: {problems}")
    except SettingsError as exc:
        _refuse(prog, str(exc))


def _refuse(prog: str, problem: str) -> NoReturn:
    sys.stderr.write(f"{prog}: {' '.join(problem.split())}\n")
    raise SystemExit(EXIT_REFUSED)
