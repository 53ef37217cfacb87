"""The job spec: what a user submits (YAML or JSON), validated strictly.

Unknown fields are errors, not ignored: a typo such as `gpu: 2` must not silently run a job without GPUs.
Its field types are in `gpuyard.shared.contracts.fieldtypes`; reading a spec file, in
`gpuyard.shared.contracts.specfiles`.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict

from gpuyard.shared.contracts.devspec import DevSpec
from gpuyard.shared.contracts.fieldtypes import (
    IDLE_OFF_PATTERN,
    TEXT_PATTERN,
    Argv,
    Bytes,
    CommandLine,
    EnvName,
    IdleSeconds,
    Integer,
    Name,
    Number,
    Seconds,
    Strict,
    Text,
)

# Named priority classes and their numeric weight; higher runs first and may preempt lower.
PRIORITY_CLASSES: dict[str, int] = {"low": 10, "normal": 50, "high": 100, "critical": 1000}
DEFAULT_PRIORITY = "normal"

MAX_REPLICAS = 1024
SERVE_MAX_RETRIES = 5
"""A serve job's `max_retries` unless it gives one: a replica that dies is restarted (with the retry
backoff) this many times; a model that cannot be loaded fails at once, with its reason (docs/models.md)."""
MAX_MODEL_VERSION = 2**31
REPLICA_START_BYTES = 212_992 - 32
"""The largest start of a replica an executor can hand its reaper (services/executor/reaper_client.py): one
datagram on a Unix socket pair, which the socket's send buffer bounds (Linux's default, `net.core.wmem_default`,
212,992 bytes, less 32 the kernel keeps). A larger one is refused by the kernel, and the job fails to start."""
SPEC_START_BYTES = 128 * 1024
"""What a spec's own part of a replica's start (`start_bytes`: its command, working_dir and env, in JSON as the
executor sends them) may take of REPLICA_START_BYTES: the rest is the platform's, the environment it adds (its
PATH, the job's identity, its publish token) and the replica's files. Under it, each argument and each variable
is also under Linux's limit on one (MAX_ARG_STRLEN, 128 KiB), which exec would refuse."""


def _priority_class(value: str) -> str:
    if value not in PRIORITY_CLASSES:
        raise ValueError(f"unknown priority class {value!r}; use one of {', '.join(PRIORITY_CLASSES)}")
    return value


Priority = Annotated[
    str, AfterValidator(_priority_class), WithJsonSchema({"type": "string", "enum": list(PRIORITY_CLASSES)})
]
"""A priority class's name (PRIORITY_CLASSES)."""
MAX_DEPLOYMENT_REPLICAS = 64


MAX_GPUS_PER_REPLICA = 64
"""The most GPUs one replica may ask for: the schema's maximum, which the submit API enforces with the cluster's
own size in its answer ("needs 100 GPUs on one node; the largest node has 4"), which a spec alone cannot know."""
MIN_GPU_SHARE = 0.01
"""The smallest share of one GPU a replica may ask for."""


GPUS_SCHEMA = {
    "anyOf": [
        {"type": "integer", "minimum": 0, "maximum": MAX_GPUS_PER_REPLICA},
        {"type": "number", "minimum": MIN_GPU_SHARE, "maximum": 1},
    ]
}
"""`Resources._gpus`'s rule in the schema: none, a share of one GPU, or whole GPUs up to MAX_GPUS_PER_REPLICA
(which the submit API enforces, with the nodes' sizes in its answer)."""


def _models_schema(schema: dict[str, Any]) -> None:
    """`Resources._models`'s rule in the schema: a list, or one text of models split by '|' or ','."""
    listed = {"type": schema.pop("type"), "items": schema.pop("items")}
    schema["anyOf"] = [listed, {"type": "string", "pattern": TEXT_PATTERN}]


def _gpus_schema(schema: dict[str, Any]) -> None:
    for bound in ("type", "minimum"):
        schema.pop(bound, None)
    schema.update(GPUS_SCHEMA)


class Resources(Strict):
    """Resources of ONE replica. `gpus` is a whole number (1, 2, 8) or a fraction of one GPU (0.25, 0.46)."""

    model_config = ConfigDict(
        json_schema_extra={  # `_memory_slice`'s rule: a gpu_memory (not null) only with some GPU
            "dependentSchemas": {
                "gpu_memory": {
                    "anyOf": [
                        {"properties": {"gpu_memory": {"type": "null"}}},
                        {"required": ["gpus"], "properties": {"gpus": {"exclusiveMinimum": 0}}},
                    ]
                }
            }
        }
    )

    gpus: Number = Field(
        0,
        ge=0,
        description="Whole GPUs (1, 2, 8) or a fraction of one GPU (0.01 ≤ gpus ≤ 1).",
        json_schema_extra=_gpus_schema,
    )
    gpu_memory: Bytes | None = Field(
        None,
        description="For a fractional GPU: its memory slice. For whole GPUs: the least memory each GPU must have.",
    )
    gpu_model: list[Text] = Field(
        default_factory=list,
        description="Allowed GPU models, e.g. [A100, H100] or 'A100|H100'; empty = any.",
        json_schema_extra=_models_schema,
    )
    cpus: Number = Field(1, gt=0, le=1024)
    memory: Bytes = Field(default=2 * 10**9, description="Host memory, e.g. '16GB'.")

    @field_validator("gpu_model", mode="before")
    @classmethod
    def _models(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [m for m in re.split(r"[|,]", value) if m.strip()]
        return value

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, value: float) -> float:
        if value > 1 and not float(value).is_integer():
            raise ValueError(
                "more than one GPU must be a whole number (2, 4, 8); fractions are for sharing one GPU"
            )
        if 0 < value < MIN_GPU_SHARE:
            raise ValueError(f"the smallest GPU share is {MIN_GPU_SHARE}")
        return float(round(value, 3))

    @model_validator(mode="after")
    def _memory_slice(self) -> Resources:
        if self.gpu_memory is not None and self.gpus == 0:
            raise ValueError("gpu_memory was given but gpus is 0")
        return self

    @property
    def whole_gpus(self) -> int:
        return int(self.gpus) if self.gpus >= 1 else 0

    @property
    def is_fractional(self) -> bool:
        return 0 < self.gpus < 1

    def total_gpus(self, replicas: int) -> float:
        return self.gpus * replicas


MAX_VOLUMES = 16
MAX_PORTS = 8


_SEGMENT = r"(?:[^./\x00][^/\x00]*|\.[^./\x00][^/\x00]*|\.\.[^/\x00]+)"
MOUNT_PATH_PATTERN = rf"^/?{_SEGMENT}(?:/{_SEGMENT})*/?$"
"""A volume's place: names joined by '/', none of them '.' or '..' (so a relative one stays in the working
directory), absolute or not, no NUL."""


def _mount_path(value: str) -> str:
    if not re.fullmatch(MOUNT_PATH_PATTERN, value):
        raise ValueError(
            f"a volume's path is folder names joined by '/', none '.' or '..', e.g. 'data/imagenet' (not {value!r})"
        )
    return value.rstrip("/") or value


MountPath = Annotated[
    str,
    AfterValidator(_mount_path),
    WithJsonSchema({"type": "string", "pattern": MOUNT_PATH_PATTERN, "maxLength": 1024}),
    Field(max_length=1024),
]


class VolumeMount(Strict):
    """A volume of the job's tenant that its replicas see at `path` (docs/volumes.md)."""

    name: Name = Field(..., description="The volume's name (`gpuyard volumes ls`).")
    path: MountPath = Field(
        ...,
        description="Where the job sees it: relative to its working directory (`data`), or absolute where the "
        "backend can mount there (Kubernetes).",
    )
    read_only: bool = Field(False, description="The job may read it but not change it.")


_PIP_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_WS = r"[ \t]*"  # (spaces and tabs only, spelt out: a JSON Schema's `\s` and Python's differ)
_PIP_VERSION = rf"(?:===|==|!=|<=|>=|~=|<|>){_WS}[A-Za-z0-9.*+!_-]+"
PIP_PATTERN = (
    rf"^{_WS}{_PIP_NAME}(?:{_WS}\[{_WS}(?:{_PIP_NAME}(?:{_WS},{_WS}{_PIP_NAME})*)?{_WS}\])?"
    rf"{_WS}(?:{_PIP_VERSION}(?:{_WS},{_WS}{_PIP_VERSION})*|@{_WS}https?://[!-:<-~]+{_WS})?(?:{_WS};{_WS}[ -~]+)?{_WS}$"
)
"""One pip requirement (PEP 508, as pip takes it on its command line): a name, extras, versions or
`@ https://…` (a wheel), a marker; never an option (`--index-url`: the platform's settings say where packages come from)."""
PYTHON_PATTERN = r"^3\.[0-9]{1,2}$"
IMAGE_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._/:@+-]*$"
MAX_PIP_REQUIREMENTS = 256


def _pip_requirement(value: str) -> str:
    if not re.fullmatch(PIP_PATTERN, value):
        what = "an option" if value.lstrip().startswith("-") else repr(value)
        raise ValueError(
            f"a pip requirement is a package name with versions, extras or a marker, e.g. 'torch==2.13.0' or "
            f"'numpy>=1.26' (not {what})"
        )
    return re.sub(r"[ \t]*(===|==|!=|<=|>=|~=|<|>|,|\[|\])[ \t]*", r"\1", " ".join(value.split()))


PipRequirement = Annotated[
    str,
    AfterValidator(_pip_requirement),
    WithJsonSchema({"type": "string", "pattern": PIP_PATTERN, "maxLength": 300}),
    Field(max_length=300),
]


class EnvironmentSpec(Strict):
    """The job's own software (docs/environments.md): on the local backend, a Python environment its node builds
    once (`pip`, `python`) and keeps for every job that asks for the same; on the Kubernetes backend, the
    container image its pods run (`image`)."""

    model_config = ConfigDict(
        json_schema_extra={  # (`_one_kind`'s rules in the schema: an image alone, or packages or a python)
            "anyOf": [
                {
                    "required": ["image"],
                    "properties": {
                        "image": {"type": "string"},
                        "python": {"type": "null"},
                        "pip": {"maxItems": 0},
                    },
                },
                {
                    "properties": {"image": {"type": "null"}},
                    "anyOf": [
                        {"required": ["pip"], "properties": {"pip": {"minItems": 1}}},
                        {"required": ["python"], "properties": {"python": {"type": "string"}}},
                    ],
                },
            ]
        }
    )

    pip: list[PipRequirement] = Field(
        default_factory=list,
        max_length=MAX_PIP_REQUIREMENTS,
        description="Packages to install, as pip takes them: `[torch==2.13.0, numpy]` (in this order). "
        "`gpuyard submit` reads `requirements: requirements.txt` (beside the spec file) into this list.",
    )
    python: str | None = Field(
        None,
        description='The Python version, major.minor ("3.11"): one the nodes offer (`gpuyard envs`); unset: '
        "the node's default.",
        json_schema_extra={"pattern": PYTHON_PATTERN},
    )
    image: str | None = Field(
        None,
        max_length=255,
        description="Kubernetes backend: the container image its pods run (e.g. `pytorch/pytorch:2.4.0-cuda12.1-"
        "cudnn9-runtime`), which carries its software; the local backend runs no images.",
        json_schema_extra={"pattern": IMAGE_PATTERN},
    )

    @model_validator(mode="before")
    @classmethod
    def _requirements_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and "requirements" in data:
            raise ValueError(
                "`requirements` names a file that `gpuyard submit` reads beside the spec file and sends as "
                "`pip`; the API takes the list itself: give `pip: [...]`"
            )
        return data

    @field_validator("python", mode="before")
    @classmethod
    def _python_text(cls, value: Any) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            raise ValueError(
                f'write the Python version in quotes, e.g. python: "3.11" (YAML reads 3.10 as the number 3.1; got {value})'
            )
        if isinstance(value, str) and not re.fullmatch(PYTHON_PATTERN, value):
            raise ValueError(f'the Python version is major.minor, e.g. "3.11" (not {value!r})')
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(IMAGE_PATTERN, value):
            raise ValueError(f"not a container image name: {value!r} (e.g. 'pytorch/pytorch:2.4.0-cuda12.1')")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> EnvironmentSpec:
        if self.image is not None and (self.pip or self.python is not None):
            raise ValueError(
                "an image carries its own software: give `image` (Kubernetes), or `pip`/`python` (the local "
                "backend), not both"
            )
        if self.image is None and not self.pip and self.python is None:
            raise ValueError("an environment names its packages (`pip`), its `python`, or its `image`")
        return self

    @property
    def wants_build(self) -> bool:
        """A Python environment the node builds (local backend), not an image."""
        return self.image is None


def environment_key(env: EnvironmentSpec, *, python: str, builder: tuple[str, ...] = ()) -> str:
    """The content hash that names a built environment on a node: its Python (major.minor, the node's default
    resolved), its requirements in their order (whitespace normalised), and the builder's settings that change
    what gets installed (`builder`: its index URL, its find-links)."""
    text = json.dumps({"python": python, "pip": env.pip, "builder": list(builder)}, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


def packages_summary(pip: list[str], most: int = 3) -> str:
    """'numpy, torch==2.13.0 and 3 more': an environment's packages in a few words (a wheel's URL left out:
    it may carry a credential)."""
    shown = ", ".join(re.sub(r"\s*@.*", " @ …", p) for p in pip[:most])
    return f"{shown} and {len(pip) - most} more" if len(pip) > most else (shown or "no packages")


class ServeSpec(Strict):
    """What a serve job serves: one published version of a model, held as ONNX Runtime sessions by the serving
    service of the node the job is placed on (docs/architecture.md, "Model deployments")."""

    model: Name = Field(..., description="The model's name.")
    version: Integer = Field(..., ge=1, le=MAX_MODEL_VERSION, description="The published version it serves.")
    tenant: Name | None = Field(
        None,
        description="The tenant that owns the model, when it is not the job's (another tenant's public model).",
    )

    @property
    def job_name(self) -> str:
        """The name a serve job shows under (`gpuyard ps`) unless it has one: `NAME:VERSION`."""
        return f"{self.model}:{self.version}"


def _given(field: str) -> JsonDict:
    """JSON Schema for: `field` is there, and not null."""
    return {"required": [field], "properties": {field: {"not": {"type": "null"}}}}


SERVE_RULES: JsonDict = {  # (`JobSpec._command_or_model`'s rules of a serve job)
    "properties": {
        "replicas": {"const": 1},
        "idle_timeout": {
            "anyOf": [{"type": "null"}, {"const": 0}, {"type": "string", "pattern": IDLE_OFF_PATTERN}]
        },
        "environment": {"type": "null"},
    }
}
"""A serve job: one replica, never stopped for idle GPUs, in the serving service's own environment."""
DEV_RULES: JsonDict = {"properties": {"replicas": {"const": 1}}}
"""A dev environment (`JobSpec._dev_environment`): one replica, running JupyterLab."""


class JobSpec(Strict):
    """A training job as submitted, or a replica of a model deployment (`serve`). Close to what dstack and
    SkyPilot users write."""

    model_config = ConfigDict(
        json_schema_extra={  # `_command_or_model`'s rules in the schema: a command, or a model to serve
            "anyOf": [
                {"allOf": [_given("command"), {"not": _given("serve")}, {"not": _given("dev")}]},
                {"allOf": [_given("serve"), {"not": _given("command")}, {"not": _given("dev")}, SERVE_RULES]},
                {"allOf": [_given("dev"), {"not": _given("command")}, {"not": _given("serve")}, DEV_RULES]},
            ]
        }
    )

    name: Name | None = Field(
        None, description="DNS-style name (lowercase, digits, '-'), at most 63 characters."
    )
    tenant: Name | None = Field(None, description="Team that owns the job; defaults to the token's tenant.")
    command: (
        Annotated[
            Annotated[CommandLine, Tag("line")] | Annotated[Argv, Tag("argv")],
            Discriminator(lambda value: "argv" if isinstance(value, list) else "line"),
        ]
        | None
    ) = Field(
        None,
        description="A string runs through /bin/sh -c; a list is executed directly without a shell. Every job "
        "but a serve job and a dev environment has one.",
    )
    working_dir: Text | None = None
    env: dict[EnvName, Text] = Field(default_factory=dict, json_schema_extra={"additionalProperties": False})
    resources: Resources = Field(default_factory=Resources)
    replicas: Integer = Field(
        1, ge=1, le=MAX_REPLICAS, description="Workers of one distributed job (gang-scheduled)."
    )
    priority: Priority = Field(DEFAULT_PRIORITY, description=f"One of: {', '.join(PRIORITY_CLASSES)}.")
    max_retries: Integer = Field(
        0,
        ge=0,
        le=100,
        description=f"Retries after a failure (default 0; {SERVE_MAX_RETRIES} for a serve job).",
    )
    timeout: Seconds | None = Field(None, description="Wall-clock limit of one attempt, e.g. '2h' or 3600.")
    idle_timeout: IdleSeconds | None = Field(
        None,
        description="Stop the job when its GPUs stay under the idle threshold (5% by default) in every sample "
        "for this long, e.g. '30m', after a warning and `idle_grace` (docs/monitor.md, Idle-GPU reclaim); it "
        "ends `failed` with the reason `idle`. Unset: its tenant's default, if any; 0 or 'off': never. At most "
        "30 days.",
    )
    idle_grace: IdleSeconds | None = Field(
        None,
        description="Time between the idle warning and the stop, e.g. '10m' (unset: the platform's "
        "`GPUYARD_IDLE_GRACE`); the job is not stopped if its GPUs get busy meanwhile. At most 30 days.",
    )
    serve: ServeSpec | None = Field(
        None,
        description="Serve a published model instead of running a command: one replica of a deployment "
        "(`POST /v1/models/{name}/deployments` writes these).",
    )
    volumes: list[VolumeMount] = Field(
        default_factory=list,
        max_length=MAX_VOLUMES,
        description="Volumes of the job's tenant it mounts: `[{name: imagenet, path: data, read_only: true}]`; "
        "each volume once, each at a path of its own.",
    )

    environment: EnvironmentSpec | None = Field(
        None,
        description='The job\'s own software: `{pip: [torch==2.13.0, numpy], python: "3.11"}` (local backend: '
        "a Python environment built once per node and reused) or `{image: ...}` (Kubernetes backend); unset: "
        "the platform's own Python (docs/environments.md).",
    )

    dev: DevSpec | None = Field(
        None,
        description="A dev environment instead of a command: JupyterLab in one replica, reached at "
        "`/dev/{id}/` through the platform (`gpuyard dev start`; docs/dev.md).",
    )

    ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=list,
        max_length=MAX_PORTS,
        json_schema_extra={"uniqueItems": True},
        description="TCP ports a replica listens on that its tenant may reach through the platform, e.g. "
        "`[6006]` for TensorBoard: `gpuyard port-forward JOB 6006`, or `/jobs/{id}/ports/6006/` (docs/access.md).",
    )

    @field_validator("ports")
    @classmethod
    def _distinct_ports(cls, ports: list[int]) -> list[int]:
        twice = sorted({p for p in ports if ports.count(p) > 1})
        if twice:
            raise ValueError(f"each port is named once: {twice[0]} is twice")
        return ports

    @field_validator("volumes")
    @classmethod
    def _distinct_volumes(cls, volumes: list[VolumeMount]) -> list[VolumeMount]:
        for what in ("name", "path"):
            seen = [getattr(v, what) for v in volumes]
            twice = sorted({x for x in seen if seen.count(x) > 1})
            if twice:
                raise ValueError(
                    f"each volume is mounted once, at a path of its own: {what} {twice[0]!r} is twice"
                )
        return volumes

    @model_validator(mode="before")
    @classmethod
    def _serve_restarts(cls, data: Any) -> Any:
        """A serve job restarts a replica that dies, unless it says otherwise (SERVE_MAX_RETRIES)."""
        if isinstance(data, dict) and data.get("serve") is not None and "max_retries" not in data:
            return {**data, "max_retries": SERVE_MAX_RETRIES}
        return data

    @model_validator(mode="after")
    def _command_or_model(self) -> JobSpec:
        if self.dev is not None:
            return self._dev_environment()
        if self.serve is None and self.command is None:
            raise ValueError(
                "a job needs a command (or `serve`: a model to serve, or `dev`: a dev environment)"
            )
        if self.serve is not None:
            if self.command is not None:
                raise ValueError("a serve job serves its model: it has no command (give one or the other)")
            if self.replicas != 1:
                raise ValueError(
                    "a serve job is one replica of a deployment: replicas must be 1 (a deployment of N "
                    "replicas is N serve jobs)"
                )
            if self.idle_timeout:
                raise ValueError(
                    "a serve job is never stopped for idle GPUs (a model server waits for requests): "
                    "leave out idle_timeout"
                )
        return self

    def _dev_environment(self) -> JobSpec:
        if self.command is not None or self.serve is not None:
            raise ValueError("a dev environment runs JupyterLab: it has no command and serves no model")
        if self.replicas != 1:
            raise ValueError("a dev environment is one replica: replicas must be 1")
        return self

    @model_validator(mode="after")
    def _environment_of_a_command(self) -> JobSpec:
        if self.environment is not None and self.serve is not None:
            raise ValueError(
                "a serve job runs in the serving service's own environment: leave out `environment`"
            )
        return self

    @property
    def priority_value(self) -> int:
        return PRIORITY_CLASSES[self.priority]

    @property
    def argv(self) -> list[str]:
        if self.dev is not None:
            return self.dev.argv()
        if self.command is None:
            raise ValueError("a serve job has no command: the serving service holds its model")
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else list(self.command)


def start_bytes(spec: JobSpec) -> int:
    """The bytes of a spec's own part of a replica's start, as the executor sends it to its reaper (JSON, every
    character not ASCII escaped): its argv, working_dir and env. 0 for a serve job (no process of its own)."""
    if spec.command is None and spec.dev is None:
        return 0
    return len(json.dumps({"argv": spec.argv, "cwd": spec.working_dir or "", "env": spec.env}))


def start_error(spec: JobSpec) -> str | None:
    """Why the executor could not start the spec's replicas, its command and environment too large for a start
    (SPEC_START_BYTES), in words that name the limit and what takes it; None when they fit. What the submit API
    and `gpuyard submit` check before a job is queued (a stored job is read as it is, whatever its size)."""
    size = start_bytes(spec)
    if size <= SPEC_START_BYTES:
        return None
    env = len(json.dumps(spec.env)) if spec.env else 0
    parts = [f"command {len(json.dumps(spec.argv)):,}"]
    if spec.env:
        parts.append(f"env {env:,} ({len(spec.env):,} variables)")
    if spec.working_dir:
        parts.append(f"working_dir {len(json.dumps(spec.working_dir)):,}")
    return (
        f"the command, working_dir and env take {size:,} bytes as a replica's start carries them "
        f"({', '.join(parts)}); at most {SPEC_START_BYTES:,}: pass large data in a file instead"
    )
