"""The job spec: what a user submits (YAML or JSON), validated strictly.

Unknown fields are errors, not ignored: a typo such as `gpu: 2` must not silently run a job without GPUs.
Its field types are in `gpuyard.shared.contracts.fieldtypes`; reading a spec file, in
`gpuyard.shared.contracts.specfiles`.
"""

from __future__ import annotations

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
    }
}
"""A serve job: one replica, never stopped for idle GPUs."""


class JobSpec(Strict):
    """A training job as submitted, or a replica of a model deployment (`serve`). Close to what dstack and
    SkyPilot users write."""

    model_config = ConfigDict(
        json_schema_extra={  # `_command_or_model`'s rules in the schema: a command, or a model to serve
            "anyOf": [
                {"allOf": [_given("command"), {"not": _given("serve")}]},
                {"allOf": [_given("serve"), {"not": _given("command")}, SERVE_RULES]},
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
        "but a serve job has one.",
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
        if self.serve is None and self.command is None:
            raise ValueError("a job needs a command (or `serve`: a model to serve)")
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

    @property
    def priority_value(self) -> int:
        return PRIORITY_CLASSES[self.priority]

    @property
    def argv(self) -> list[str]:
        if self.command is None:
            raise ValueError("a serve job has no command: the serving service holds its model")
        return ["/bin/sh", "-c", self.command] if isinstance(self.command, str) else list(self.command)


def start_bytes(spec: JobSpec) -> int:
    """The bytes of a spec's own part of a replica's start, as the executor sends it to its reaper (JSON, every
    character not ASCII escaped): its argv, working_dir and env. 0 for a serve job (no process of its own)."""
    if spec.command is None:
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
