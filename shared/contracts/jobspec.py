"""The job spec: what a user submits (YAML or JSON), validated strictly.

Unknown fields are errors, not ignored: a typo such as `gpu: 2` must not silently run a job without GPUs.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import sys
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    PlainSerializer,
    StringConstraints,
    Tag,
    ValidationError,
    WithJsonSchema,
    WrapValidator,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from gpuyard.shared.contracts.units import parse_duration, parse_size

# Named priority classes and their numeric weight; higher runs first and may preempt lower.
PRIORITY_CLASSES: dict[str, int] = {"low": 10, "normal": 50, "high": 100, "critical": 1000}
DEFAULT_PRIORITY = "normal"

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
TEXT_PATTERN = r"^[^\x00]*$"
COMMAND_PATTERN = r"^[^\x00]*[^\x00\s][^\x00]*$"
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


def _matching(pattern: str, message: str) -> Any:
    """A string that matches `pattern`, which the JSON schema carries too (one definition of the rule), refused
    with `message`. Every string of a spec has one: a NUL byte cannot reach exec, an environment or a path
    (C strings end at it), and the pattern also refuses a lone surrogate (text no store or answer can hold)."""

    def check(value: Any, handler) -> str:
        try:
            return handler(value)
        except ValidationError as exc:
            kind = exc.errors()[0]["type"]
            if kind == "string_unicode":
                raise ValueError("not valid Unicode text (it has a lone surrogate)") from None
            if kind == "string_pattern_mismatch":
                raise ValueError(message) from None
            raise

    return Annotated[str, StringConstraints(pattern=pattern), WrapValidator(check)]


Name = _matching(
    NAME_PATTERN, "use lowercase letters, digits and '-', start and end with a letter or digit, ≤ 63 chars"
)
EnvName = _matching(
    ENV_NAME_PATTERN, "an environment variable name is letters, digits and '_', not first a digit"
)
Text = _matching(TEXT_PATTERN, "must not contain a NUL byte")
CommandLine = _matching(COMMAND_PATTERN, "the command is empty or contains a NUL byte")


def _program(argv: list[str]) -> list[str]:
    if not argv[0]:
        raise ValueError("the program to run (the list's first item) is empty")
    return argv


Argv = Annotated[  # (the schema's prefixItems is `_program`'s rule)
    list[Text],
    Field(min_length=1, json_schema_extra={"prefixItems": [{"type": "string", "minLength": 1}]}),
    AfterValidator(_program),
]


def _json_number(error: str, kind: str) -> Any:
    """A number as JSON Schema's type says it (`kind`: "an integer", "a number"): never true or false, nor
    text, which pydantic's own reading would take for 1, 0 or the number it spells (`max_retries: false` is
    not 0); refused as pydantic's `error` says it."""

    def check(value: Any) -> Any:
        if isinstance(value, bool | str):
            what = "true or false" if isinstance(value, bool) else "text"
            raise PydanticCustomError(error, f"Input should be {kind}, not {what}")
        return value

    return BeforeValidator(check)


JSON_INTEGER = _json_number("int_type", "an integer")
Integer = Annotated[int, JSON_INTEGER]
"""An integer of a request's body: 2 (or 2.0), never true or false nor "2". (Optional and bounded:
`Annotated[int, Field(ge=…), JSON_INTEGER] | None`, the bounds first, or the schema loses them.)"""
Number = Annotated[float, _json_number("float_type", "a number")]
"""A number of a request's body: 0.5 or 2, never true or false nor "0.5"."""

SIZE_PATTERN = r"^ *[0-9]+(\.[0-9]+)? *([kKmMgGtT][iI]?[bB]?|[bB])? *$"
"""A size as text: a number of bytes, or of KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (of 1024),
any case ('16GB', '512Mi', '10 kb')."""
DURATION_SYNTAX = r" *([0-9]+(\.[0-9]+)?|([0-9]+(\.[0-9]+)? *[smhdSMHD] *)+) *"
"""A duration as text: seconds, or parts of days, hours, minutes and seconds ('90s', '1h30m', '2d')."""
_NONZERO = r"([0-9]*[1-9][0-9]*(\.[0-9]+)?|[0-9]+\.[0-9]*[1-9][0-9]*)"
_PART = r"[0-9]+(\.[0-9]+)? *[smhdSMHD]"
DURATION_PATTERN = rf"^ *({_NONZERO}|({_PART} *)*{_NONZERO} *[smhdSMHD]( *{_PART})*) *$"
"""DURATION_SYNTAX, of more than no time: what `Seconds` takes as text (some number in it is not zero)."""
QUANTITY_MAX = 64
"""The longest size or duration written as text (a longer number could not be read as one)."""


def _size(value: Any) -> int:
    if isinstance(value, str) and (len(value) > QUANTITY_MAX or not re.fullmatch(SIZE_PATTERN, value)):
        raise ValueError(
            f"cannot read {value!r} as a size; write it like '16GB', '512MiB' or a number of bytes"
        )
    return parse_size(value)


def _duration(value: Any) -> float:
    if isinstance(value, str) and (len(value) > QUANTITY_MAX or not re.fullmatch(DURATION_SYNTAX, value)):
        raise ValueError(f"cannot read {value!r} as a duration; write it like '90s', '45m', '2h' or '1h30m'")
    return parse_duration(value)


SIZE_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0},
        {"type": "string", "pattern": SIZE_PATTERN, "maxLength": QUANTITY_MAX},
    ]
}
DURATION_SCHEMA = {
    "anyOf": [
        {"type": "number", "exclusiveMinimum": 0},
        {"type": "string", "pattern": DURATION_PATTERN, "maxLength": QUANTITY_MAX},
    ]
}
Bytes = Annotated[
    int, BeforeValidator(_size), PlainSerializer(int, return_type=int), WithJsonSchema(SIZE_SCHEMA)
]
Seconds = Annotated[float, BeforeValidator(_duration), WithJsonSchema(DURATION_SCHEMA)]

MAX_IDLE_SECONDS = 30 * 86400.0
"""The longest `idle_timeout` and `idle_grace` a job may give (30 days)."""


IDLE_OFF_PATTERN = r"^ *([oO][fF][fF]|[nN][eE][vV][eE][rR]|0+(\.0+)?) *$"
"""An idle duration of none, as text ('off', 'never', '0')."""


def _idle_duration(value: Any) -> float:
    """A duration of the idle-GPU reclaim: '30m', 1800…; 0, 'off' or 'never': 0 (off, for `idle_timeout`;
    no wait, for `idle_grace`)."""
    if isinstance(value, str) and len(value) <= QUANTITY_MAX and re.fullmatch(IDLE_OFF_PATTERN, value):
        return 0.0
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    seconds = _duration(value)
    if seconds > MAX_IDLE_SECONDS:
        raise ValueError("at most 30 days, or 'off'")
    return seconds


IdleSeconds = Annotated[
    float,
    BeforeValidator(_idle_duration),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "minimum": 0, "maximum": MAX_IDLE_SECONDS},
                {"type": "string", "pattern": IDLE_OFF_PATTERN, "maxLength": QUANTITY_MAX},
                {"type": "string", "pattern": DURATION_PATTERN, "maxLength": QUANTITY_MAX},
            ]
        }
    ),
]


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


class Strict(BaseModel):
    """A spec or a request body: unknown fields are refused, each with the closest known one ("did you mean
    `gpus`?")."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @model_validator(mode="wrap")
    @classmethod
    def _unknown_fields(cls, data: Any, handler) -> Any:
        try:
            return handler(data)
        except ValidationError as exc:
            errors = exc.errors()
            if not any(e["type"] == "extra_forbidden" and len(e["loc"]) == 1 for e in errors):
                raise
            raise ValidationError.from_exception_data(
                exc.title, [_suggested(cls, e) for e in errors]
            ) from None


def unknown_field_message(field: str, known: list[str]) -> str:
    """Pydantic's words for an unknown field, with the closest known one ('Extra inputs are not permitted; did
    you mean `gpus`?'), or the known fields when none is close."""
    close = difflib.get_close_matches(field, known, n=1, cutoff=0.6)
    if close:
        return f"Extra inputs are not permitted; did you mean `{close[0]}`?"
    return f"Extra inputs are not permitted; the fields here are {', '.join(known)}"


def _suggested(model: type[BaseModel], error: Any) -> InitErrorDetails:
    """`error` as it was, but an unknown field of `model` itself said with the closest known field. (Raised
    again as a new ValidationError: the errors keep their type, place and message; a rebuilt one loses its
    `ctx`, which only `unknown field` errors at the same level cause.)"""
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        message = unknown_field_message(str(error["loc"][0]), list(model.model_fields))
    else:
        message = error["msg"]
    template = message.replace("{", "{{").replace("}", "}}")
    return InitErrorDetails(
        type=PydanticCustomError(error["type"], template), loc=error["loc"], input=error["input"]
    )


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


def _given(field: str) -> dict[str, Any]:
    """JSON Schema for: `field` is there, and not null."""
    return {"required": [field], "properties": {field: {"not": {"type": "null"}}}}


SERVE_RULES = {  # (`JobSpec._command_or_model`'s rules of a serve job)
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


class SpecError(ValueError):
    """A job spec file that cannot be read; the message is meant for people."""


def too_long_number(digits: int) -> str:
    """Why a number of `digits` digits is refused: more than Python reads as an integer (sys.int_info's
    default_max_str_digits, 4300), and far more than any field of a spec takes."""
    return (
        f"a number of {digits:,} digits, more than can be read (at most {sys.get_int_max_str_digits():,}): "
        "no field of a job spec takes one"
    )


def read_int(text: str) -> int:
    """An integer of a spec's JSON (`json.loads`'s `parse_int`): a SpecError saying why for one too long to
    read, where Python's own ValueError would be a 500 (an API) or a traceback (the CLI)."""
    try:
        return int(text)
    except ValueError:
        raise SpecError(too_long_number(len(text.lstrip("-")))) from None


class SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, with an integer too long to read a YAML error at its line and column (PyYAML's
    own reading raises Python's ValueError)."""

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # (decimal digits past the limit)
            digits = max(map(len, re.findall(r"[0-9]+", str(node.value).replace("_", ""))))
            raise yaml.constructor.ConstructorError(
                None, None, too_long_number(digits), node.start_mark
            ) from None
        limit = sys.get_int_max_str_digits()  # (hexadecimal, octal, binary: read without it)
        if limit and value.bit_length() > 3 * limit and abs(value) >= 10**limit:  # (2**(3n) < 10**n)
            digits = int(abs(value).bit_length() * math.log10(2)) + 1
            raise yaml.constructor.ConstructorError(None, None, too_long_number(digits), node.start_mark)
        return value


SpecLoader.add_constructor("tag:yaml.org,2002:int", SpecLoader.construct_yaml_int)


def load_spec_text(text: str, *, filename: str = "<spec>") -> dict[str, Any]:
    """Parse YAML or JSON text into a dict (not yet validated). A SpecError names `filename` and where in it
    the text went wrong ('job.yaml, line 2, column 5: not valid YAML: ...'), its cause the parser's error."""
    try:
        data = json.loads(text, parse_int=read_int) if filename.endswith(".json") else spec_yaml(text)
    except SpecError as exc:
        raise SpecError(f"{filename}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise SpecError(
            f"{filename}, line {exc.lineno}, column {exc.colno}: not valid JSON: {exc.msg}"
        ) from exc
    except yaml.YAMLError as exc:
        raise SpecError(yaml_error_text(filename, exc)) from exc
    except RecursionError:
        raise SpecError(f"{filename}: nested too deeply to be a job spec") from None
    if not isinstance(data, dict):
        raise SpecError(f"{filename}: a job spec must be a mapping of fields, got {type(data).__name__}")
    return data


def spec_yaml(text: str) -> Any:
    """The value of a YAML text, read as `yaml.safe_load` reads it (SpecLoader)."""
    return yaml.load(text, Loader=SpecLoader)  # (a SafeLoader)


def yaml_error_text(filename: str, exc: yaml.YAMLError) -> str:
    """A YAML error in one line, at the file the user named (PyYAML's own text says `"<unicode string>"`):
    'job.yaml, line 4, column 1: not valid YAML: expected ...'."""
    mark, why = yaml_problem(exc)
    where = f"{filename}, line {mark.line + 1}, column {mark.column + 1}" if mark else filename
    return f"{where}: not valid YAML: {why}"


def yaml_problem(exc: yaml.YAMLError) -> tuple[yaml.Mark | None, str]:
    """Where a YAML text went wrong, and why in words: "expected ',' or ']', but got '<stream end>' (while
    parsing a flow sequence from line 2, column 12)"."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return None, str(exc)
    mark = exc.problem_mark or exc.context_mark
    why = exc.problem or exc.context or "not valid YAML"
    if exc.problem and exc.context:
        context = exc.context_mark
        at = (
            f" from line {context.line + 1}, column {context.column + 1}"
            if context and context != mark
            else ""
        )
        why += f" ({exc.context}{at})"
    return mark, why


def load_spec_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    return load_spec_text(text, filename=str(path))
