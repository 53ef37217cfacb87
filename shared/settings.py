"""Settings of every service and of the CLI client: one pydantic-settings model each, read from GPUYARD_*
environment variables and, for the services, the same names as flags (`--cycle-interval 0.5`), flags first.

Each default and each description is written once, here: `gpuyard up`'s flags, the services and the settings
tables of docs/operations.md (`python -m gpuyard.shared.settingsdocs`) all take them from these models. Nothing else in
the project reads os.environ for configuration.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path
from typing import Annotated, Literal, NoReturn, TypeVar

from pydantic import BeforeValidator, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict, SettingsError

from gpuyard.shared.kubernetes_settings import KubernetesConfig
from gpuyard.shared.logstore import log_store_url as log_store_beside
from gpuyard.shared.policies import BackfillMode, Policy
from gpuyard.shared.units import parse_duration, parse_size

ENV_PREFIX = "GPUYARD_"


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


def _keep_for(value: object) -> object:
    """'7d', '12h', a number of seconds; '0' or 'never': kept for ever (0)."""
    if isinstance(value, str) and value.strip().lower() in ("never", "0", "forever", ""):
        return 0.0
    if isinstance(value, int | float) and value == 0:
        return 0.0
    return parse_duration(value)


def _comma_list(value: object) -> object:
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
        "7d",
        description="How long a finished job's working directories, node log files, shipped output and "
        "intermediate events are kept after it ends (`7d`, `12h`); its state and first and last events are "
        "kept for good. `never` (or 0): everything is kept.",
    )
    retention_interval: float = Field(
        3600.0, gt=0, description="Seconds between retention sweeps (the executor's, the submit service's)."
    )
    stream_max_bytes: Size = Field(
        "1GiB",
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
        "s3://bucket/prefix (needs the `s3` extra, see docs/models.md; credentials from s3fs's usual places); "
        "default: models/ in the data dir. See docs/models.md.",
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
        return self.log_store or log_store_beside(self.store_url)

    @property
    def store_url(self) -> str:
        return self.store or f"sqlite:///{self.data_dir / 'events.db'}"

    @property
    def model_store_url(self) -> str:
        return self.model_store or str(self.data_dir / "models")

    @property
    def nats_servers(self) -> list[str]:
        return [u.strip() for u in self.nats_url.split(",") if u.strip()]


class SubmitSettings(CommonSettings):
    """The submit API."""

    submit_host: str = Field(
        "127.0.0.1", description="Address the API listens on; another than loopback needs tokens."
    )
    submit_port: Port = Field(8080, description="Port of the API.")
    store_durable_commits: bool = Field(
        True, description="As for every service, on here: a job is accepted (202) once it is on disk."
    )
    accept_unplaceable: bool = Field(
        False,
        description="Queue a job that no node could ever hold, even empty, to wait for a cluster that grows "
        "(new nodes, autoscaling); by default it is refused (422) with the largest node and the whole cluster.",
    )
    tokens_file: Path | None = Field(
        None,
        description="JSON/YAML file of tokens, kept hashed, re-read when it changes: "
        "`{tokens: {sha256:<hex>: {id, tenant, user, admin, created, expires}}}` (a plain token as key is read "
        "too); `gpuyard admin tokens` manages it.",
    )
    tokens: str = Field("", description="Inline tokens: `token=tenant[:user][:admin],…`.")
    session_secret_file: Path | None = Field(
        None,
        description="The key that signs the dashboard's login sessions; default `<data dir>/secrets/session.key`, "
        "made at start (mode 0600). Every submit instance and the serving entry point of one platform need the same key.",
    )
    serving_url: str = Field(
        "",
        description="The serving entry point's address as the dashboard's pages call it (the Models page's "
        "inference form); `gpuyard up` sets it; empty: the page's own host on port 8000.",
    )
    session_lifetime: Duration = Field(
        12 * 3600.0, gt=0, description="How long a dashboard login lasts (`12h`); revoking its token ends it."
    )
    max_body_bytes: int = Field(1 << 20, description="Largest request body the API accepts, in bytes.")
    max_model_bytes: Size = Field(
        "1GiB",
        description="Largest ONNX file `POST /v1/models` accepts (a single-file model: ONNX's own limit is 2 "
        "GiB), from a token that may publish; streamed to disk, never held in memory.",
    )
    max_uploads_per_tenant: int = Field(
        2,
        ge=1,
        description="Model uploads (`POST /v1/models`) one tenant may have in progress at once on a submit "
        "instance; one more gets 429 with Retry-After and the reason.",
    )
    model_check_timeout: Duration = Field(
        120.0,
        gt=0,
        description="How long reading and checking an uploaded ONNX file may take (`2m`), in a process of its "
        "own; a file that needs longer is refused (422).",
    )
    model_check_memory: Size = Field(
        "4GiB",
        ge=256 * 1024 * 1024,
        description="Address space the process that checks an uploaded ONNX file may use (its RLIMIT_AS: about "
        "three times the file, and 200 MB for the libraries); a file that needs more is refused (422).",
    )
    max_queued_per_tenant: int = Field(
        10_000,
        ge=0,
        description="Jobs a tenant may have waiting to be placed (queued, pending included); a submit beyond "
        "it gets 429 with Retry-After. 0: no limit.",
    )
    queue_limits: TenantNumbers = Field(
        default_factory=dict,
        description="A tenant's own limit instead of max_queued_per_tenant, `vision=50000`; 0: no limit.",
    )
    quotas: TenantNumbers = Field(
        default_factory=dict,
        description="Guaranteed GPUs per tenant, as the scheduler's `quotas` (the same variable): the "
        "guaranteed figure of `GET /v1/tenants`.",
    )


class SchedulerSettings(CommonSettings):
    """The scheduler."""

    policy: Policy = Field(
        Policy.GPUYARD, description=f"Placement policy: {', '.join(Policy)} (see docs/scheduler.md)."
    )
    cycle_interval: float = Field(
        1.0, description="Seconds between timer-driven cycles (events also trigger one)."
    )
    node_timeout: float = Field(
        30.0, description="Seconds without a heartbeat before a node is lost and its jobs requeued."
    )
    quotas: TenantNumbers = Field(
        default_factory=dict,
        description="Guaranteed GPUs per tenant, `vision=8,nlp=4` or a JSON object; empty: no quotas (one "
        "shared pool).",
    )
    tenant_weights: TenantNumbers = Field(
        default_factory=dict,
        description="Fair-share weight per tenant inside a priority class, `vision=2`; 1 for a tenant not named.",
    )
    user_gpu_cap: TenantNumbers = Field(
        default_factory=dict,
        description="Most GPUs one user of a tenant may hold, `vision=4`; `*=4` for every tenant.",
    )
    fair_share: bool = Field(
        True, description="Fair share across tenants inside a priority class; false: arrival order."
    )
    borrowing: bool = Field(
        True, description="A tenant may run above its quota on idle GPUs; that work is reclaimed first."
    )
    preemption: bool = Field(True, description="Higher priority and quota reclaims may preempt running jobs.")
    min_runtime_before_preemption: float = Field(
        300.0, description="Seconds a job runs before it may be preempted (no thrashing)."
    )
    preemption_grace: float = Field(
        30.0, description="Seconds a preempted job gets between SIGTERM and SIGKILL."
    )
    backfill: BackfillMode = Field(
        BackfillMode.EASY,
        description="easy (never delays the reservations of the first blocked jobs: reservation_depth), greedy or off (strict order).",
    )
    reservation_depth: int = Field(
        8,
        ge=1,
        description="With easy backfill, how many of the first jobs blocked on resources get a reservation "
        "that later jobs may not delay; 1: classic EASY.",
    )
    pending_after: float = Field(
        5.0,
        description="Seconds a job that only waits its turn for busy resources waits before the scheduler "
        "stores why (a burst of jobs placed within it writes no reasons); a reason that says it cannot run soon "
        "(too_large, quota_exhausted…) or that it preempts is stored at once; 0: every reason at once.",
    )
    lease_ttl: float = Field(
        10.0, ge=1, description="Seconds a leader's lease lasts; another replica takes over after it lapses."
    )
    resync_interval: float = Field(
        30.0,
        description="Seconds between checks of every live job's version against the event store (the jobs that "
        "differ are read again).",
    )


class ExecutorSettings(CommonSettings):
    """The executor. Its Kubernetes backend's settings are `kubernetes`: GPUYARD_KUBERNETES_<FIELD>."""

    model_config = SettingsConfigDict(env_nested_delimiter="_", env_nested_max_split=1)
    """GPUYARD_KUBERNETES_IMAGE_PULL_POLICY is kubernetes.image_pull_policy: split once, after KUBERNETES."""

    node_name: str = Field(
        default_factory=socket.gethostname,
        description="The node this executor announces (default: hostname).",
    )
    simulate_gpus: int = Field(0, description="Announce N virtual GPUs when NVML finds none.")
    simulated_gpu_model: str = Field("SIM-GPU", description="Model name of the simulated GPUs.")
    simulated_gpu_memory: str = Field("16GiB", description="Memory of each simulated GPU.")
    executor_backend: Literal["local", "kubernetes"] = Field(
        "local", description="local (process groups on this node) or kubernetes (one pod per replica)."
    )
    advertise_address: str = Field(
        "", description="This node's address for MASTER_ADDR of multi-node jobs; default: the hostname's."
    )
    heartbeat_interval: float = Field(5.0, description="Seconds between node heartbeats.")
    grace_seconds: float = Field(10.0, description="SIGTERM-to-SIGKILL grace when stopping a job.")
    retry_backoff: float = Field(5.0, description="Seconds before the first retry; doubles each attempt.")
    event_concurrency: int = Field(
        64, description="Job events handled at once (events of one job always in order)."
    )
    executor_workers: int = Field(
        1, ge=1, le=64, description="Executor processes sharing this node's placements (local backend)."
    )
    executor_worker: int = Field(
        0, ge=0, description="Which of them this one is, from 0 (0 announces the node)."
    )
    log_max_bytes: Size = Field(
        "64MiB", description="Size of a replica's log file before it is rotated (0: never rotated)."
    )
    log_backups: int = Field(4, ge=0, description="Rotated log files kept per replica and attempt.")
    tenant_log_budget: Size = Field(
        "2GiB",
        ge=0,
        description="Most node log the running replicas of one tenant hold on this node together (their log "
        "files, rotated ones included; the node's executor processes share it equally): beyond it their output "
        "is dropped, after a line saying so, until one of them ends (0: no limit).",
    )
    replica_start: Literal["helper", "fork"] = Field(
        "helper",
        description="How the reaper starts a replica: helper (a small C library built at the start with the "
        "node's C compiler; without one, fork) or fork (its child takes the steps in Python: ~1.4 ms more CPU).",
    )
    cgroup_limits: bool = Field(True, description="Enforce cpus and memory through cgroup v2 where writable.")
    cgroup_root: Path = Field(Path("/sys/fs/cgroup"), description="Mount point of the cgroup v2 hierarchy.")
    cgroup_parent: str = Field(
        "", description="Cgroup (under the root) to create job cgroups in; default: the executor's own."
    )
    job_users: str = Field(
        "",
        description="Local user of each tenant's jobs when the platform runs as root: `vision=gpu-vision,"
        "nlp=1500:1500,*=nobody` (a name or uid[:gid]; `*`: every other tenant); empty: each tenant its own "
        "uid, JOB_UID_BASE + a number derived from its name, no account needed. Never root.",
    )
    job_uid_base: int = Field(
        2_000_000, ge=1, description="First uid of the users derived from tenants' names (see JOB_USERS)."
    )
    job_root: Path = Field(
        Path("/var/lib/gpuyard-jobs"),
        description="Where jobs that run as other users get their working directories (outside the private "
        "data directory; every folder above it must be searchable by all). Unused when not root.",
    )
    gpu_memory_policy: Literal["warn", "stop", "off"] = Field(
        "warn", description="A job over its GPU memory slice: warn (alert) or stop it after the grace."
    )
    gpu_memory_grace: float = Field(30.0, ge=0, description="Seconds over its slice before a job is stopped.")
    gpu_memory_interval: float = Field(5.0, gt=0, description="Seconds between GPU memory readings.")
    gpu_memory_slack: Size = Field(
        "512MiB", description="Tolerated use above a slice: NVML counts the CUDA context (~0.5 GiB) too."
    )
    mps: Literal["auto", "on", "off"] = Field(
        "auto", description="Give fractional jobs CUDA MPS limits: auto = when an MPS daemon runs here."
    )
    api_url: str = Field(
        "http://127.0.0.1:8080",
        description="URL of the submit API as jobs reach it: given to each replica as GPUYARD_SERVER, with "
        "its publish token (`gpuyard up` sets it).",
    )
    publish_token_lifetime: Duration = Field(
        "7d",
        description="How long a job's publish token is valid at most (`7d`, `12h`): it is refused sooner, once "
        "the attempt that got it has ended.",
    )
    kubeconfig: str = Field(
        "",
        description="Kubernetes backend: kubeconfig file outside a cluster (default: in-cluster credentials).",
    )
    kubernetes: KubernetesConfig = Field(
        default_factory=KubernetesConfig, description="The Kubernetes backend's settings."
    )

    @model_validator(mode="after")
    def _one_worker_index_per_process(self) -> ExecutorSettings:
        if self.executor_worker >= self.executor_workers:
            raise ValueError(
                f"executor_worker {self.executor_worker} is not below executor_workers {self.executor_workers}"
            )
        if self.executor_workers > 1 and self.executor_backend != "local":
            raise ValueError("several executor workers per node need the local backend")
        return self


class MonitorSettings(CommonSettings):
    """The monitor: one per node. It samples the node's GPUs (NVML, or the virtual GPUs of `--simulate-gpus`),
    publishes `gpu.sample`, serves Prometheus `/metrics` with the DCGM exporter's names, and raises and
    resolves alerts (docs/monitor.md)."""

    node_name: str = Field(
        default_factory=socket.gethostname,
        description="The node whose GPUs it samples: the executor's node name (default: hostname).",
    )
    simulate_gpus: int = Field(
        0,
        description="Virtual GPUs of the node when NVML finds none: each reports the CPU use of the job "
        "replica placed on it as its utilization, and its slice as its memory (docs/monitor.md).",
    )
    simulated_gpu_model: str = Field(
        "SIM-GPU", description="Model name of the simulated GPUs (the executor's)."
    )
    simulated_gpu_memory: Size = Field("16GiB", description="Memory of each simulated GPU (the executor's).")
    sample_interval: Duration = Field(
        1.0, gt=0, description="Seconds between two samples of the node's GPUs (one `gpu.sample` each)."
    )
    jobs_interval: Duration = Field(
        2.0,
        gt=0,
        description="Seconds between two reads of the live jobs from the event store (only those that "
        "changed are read): the holders of the node's GPUs and the platform figures of /metrics.",
    )
    metrics_host: str = Field("127.0.0.1", description="Address of the Prometheus /metrics endpoint.")
    metrics_port: PortOrAny = Field(
        9400,
        description="Port of the Prometheus /metrics endpoint (the DCGM exporter's); 0 picks a free one.",
    )
    metrics_scope: Literal["cluster", "node"] = Field(
        "cluster",
        description="cluster: /metrics shows every node's GPUs (their `gpu.sample` events) and the platform "
        "figures; node: this node's GPUs only (one monitor per node, each scraped, as a DaemonSet is).",
    )
    metrics_auth: Literal["token", "off"] = Field(
        "token",
        description="Who may read /metrics, which names the job, tenant and user on every GPU: token (a scrape "
        "that carries the token of metrics_token_file, as a bearer token or as the basic-auth password; 401 "
        "otherwise) or off (anyone who reaches its address: only on an address jobs cannot reach). The same "
        "variable as the serving entry point's.",
    )
    metrics_token_file: Path | None = Field(
        None,
        description="The scrape token of /metrics (mode 0600), shared with the serving entry point; default "
        "`<data dir>/secrets/metrics.token`, made at start. Prometheus sends it: `authorization: "
        "{credentials_file: …}` (deploy/prometheus/prometheus.yml).",
    )
    quotas: TenantNumbers = Field(
        default_factory=dict,
        description="Guaranteed GPUs per tenant, as the scheduler's `quotas` (the same variable): the "
        "guaranteed figure of /metrics.",
    )
    alert_rules: Path | None = Field(
        None,
        description="A YAML file of alert rules that replace the defaults' thresholds and times "
        "(docs/alerts.md); default: the built-in rules.",
    )
    alert_webhooks: Annotated[list[str], NoDecode, BeforeValidator(_comma_list)] = Field(
        default_factory=list,
        description="URLs every alert.raised and alert.resolved is POSTed to (Slack-compatible JSON), "
        "comma-separated.",
    )
    webhook_timeout: Duration = Field(5.0, gt=0, description="Seconds a webhook may take to answer.")
    webhook_max_backoff: Duration = Field(
        300.0, gt=0, description="Longest wait between two tries of a failing webhook (the wait doubles)."
    )
    history_raw_keep: Duration = Field(
        3600.0,
        gt=0,
        description="How long the GPU history keeps every sample of the node's GPUs (`gpu_history.db` beside "
        "a SQLite event store, or its MongoDB database); older ones are merged into one point per `history_bucket`.",
    )
    history_bucket: Duration = Field(
        60.0,
        gt=0,
        description="Seconds each point of the older GPU history stands for (a minute by default).",
    )
    history_keep: Duration = Field(
        7 * 86400.0,
        gt=0,
        description="How long the GPU history keeps its points at all (`7d`): the span of `gpuyard usage`'s "
        "used GPU-hours and of a job's GPU figures.",
    )
    history_flush_interval: Duration = Field(
        5.0, gt=0, description="Seconds between two writes of the node's samples to the GPU history."
    )
    idle_timeouts: TenantDurations = Field(
        default_factory=dict,
        description="Idle-GPU reclaim: the `idle_timeout` of a tenant's jobs that give none, `vision=30m,nlp=1h` "
        "(`*`: every other tenant; 0 or off: none); empty: only jobs that ask are stopped for idle GPUs "
        "(docs/monitor.md).",
    )
    idle_threshold_pct: float = Field(
        5.0,
        ge=0,
        le=100,
        description="Idle-GPU reclaim: a job's GPUs are idle while every sample of each of them reads under "
        "this utilization, in %.",
    )
    idle_grace: Duration = Field(
        600.0,
        gt=0,
        description="Idle-GPU reclaim: time between a job's idle warning and its stop, for jobs that give no "
        "`idle_grace`.",
    )
    idle_min_age: KeepFor = Field(
        300.0,
        ge=0,
        description="Idle-GPU reclaim: the start-up allowance: samples of a job's first minutes (from its start) "
        "do not count towards its idle timeout.",
    )


class ServingSettings(CommonSettings):
    """Model serving: the node's serving service hosts the serve jobs placed on its node (ONNX Runtime
    sessions) and answers the Open Inference Protocol (docs/serving.md)."""

    serving_host: str = Field("127.0.0.1", description="Address the serving API listens on.")
    serving_port: Port = Field(8000, description="Port of the serving API, Triton's HTTP port.")
    serving_advertise: str = Field(
        "",
        description="The serving API's URL as the other nodes' serving services reach it (`model.ready`'s "
        "endpoint), e.g. http://10.0.0.7:8000; default: http://<serving host, or this host's name when it "
        "listens on every address>:<serving port>.",
    )
    node_name: str = Field(
        default_factory=socket.gethostname,
        description="The node whose serve jobs this service hosts: the executor's node name (default: hostname).",
    )
    tokens_file: Path | None = Field(
        None,
        description="The API's tokens file: inference takes the same bearer tokens (see the submit API).",
    )
    tokens: str = Field("", description="Inline tokens, as the API's: `token=tenant[:user][:admin],…`.")
    session_secret_file: Path | None = Field(
        None,
        description="The key of the dashboard's login sessions, the submit service's (the dashboard's inference "
        "form calls this entry point with its session cookie); default `<data dir>/secrets/session.key`.",
    )
    dashboard_origins: str = Field(
        "http://127.0.0.1:8080,http://localhost:8080",
        description="The dashboard's origins, comma-separated: their pages may call this entry point from the "
        "browser (CORS, with the session cookie); `gpuyard up` passes its own.",
    )
    retry_backoff: float = Field(
        5.0, description="Seconds before a serve job's first retry (the executor's setting, for serve jobs)."
    )
    event_concurrency: int = Field(16, description="Job events handled at once (those of one job in order).")
    serving_threads: int = Field(
        1, ge=1, description="ONNX Runtime intra-op threads of each session (CPU provider)."
    )
    max_batch_size: int = Field(
        0, ge=0, description="Dynamic batching: most requests merged into one run per model (0 or 1: off)."
    )
    max_queue_delay_us: int = Field(
        0, ge=0, description="Dynamic batching: microseconds a request may wait for others to join its batch."
    )
    max_request_bytes: Size = Field(
        64 * 1024 * 1024,
        gt=0,
        description="Largest request body the serving API reads, in bytes or with a unit (`256MiB`); default "
        "64 MiB, Triton's `--http-max-input-size`. A model's inputs give a tighter limit (`max_request_rows`); "
        "over it: 413, from `Content-Length` before the body is read.",
    )
    max_request_rows: int = Field(
        1024,
        ge=1,
        description="Most rows (the first dimension, when it is dynamic) one inference request may carry: more "
        "is a 413; with the model's inputs it bounds the request's body (docs/serving.md, \"Request limits\").",
    )
    metrics_auth: Literal["token", "off"] = Field(
        "token",
        description="Who may read /metrics, which names each tenant's models and their request counts: token "
        "(the scrape token of metrics_token_file, as a bearer token or the basic-auth password; a tenant's own "
        "token or dashboard session reads its own models' series) or off (anyone who reaches the address). The "
        "same variable as the monitor's.",
    )
    metrics_token_file: Path | None = Field(
        None,
        description="The scrape token of /metrics (mode 0600), the monitor's; default "
        "`<data dir>/secrets/metrics.token`, made at start.",
    )

    @property
    def dashboard_origin_list(self) -> frozenset[str]:
        return frozenset(o.strip().rstrip("/") for o in self.dashboard_origins.split(",") if o.strip())

    @property
    def advertised_url(self) -> str:
        if self.serving_advertise:
            return self.serving_advertise.rstrip("/")
        host = self.serving_host
        if host in ("0.0.0.0", "::", ""):
            host = socket.gethostname()
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.serving_port}"


class ClientSettings(BaseSettings):
    """The `gpuyard` CLI and `gpuyard.client.Client`; their --server and --token flags come first."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore")

    server: str = Field(
        "",
        description="URL of the submit API, over the context's (default: the context's, else "
        "http://127.0.0.1:8080).",
    )
    token: str = Field("", description="Bearer token, over the context's (default: the context's).")
    publish_token: str = Field(
        "",
        description="Set by the executor in a job's environment, never by hand: the job's token for "
        "`gpuyard.publish_model` (`POST /v1/models` only; see docs/models.md).",
    )
    context: str = Field(
        "",
        description="The context (a platform `gpuyard up` saved: `gpuyard context ls`) whose server and token "
        "commands use, as `--context`; default: the current one (`gpuyard context use`).",
    )
    config_dir: Path = Field(
        default_factory=lambda: Path.home() / ".config" / "gpuyard",
        description="Where `gpuyard up` saves each platform's context for the CLI (config.json): its server URL, "
        "admin token and data dir.",
    )


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
