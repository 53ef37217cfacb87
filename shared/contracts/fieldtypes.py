"""The field types of a job spec and of the API's request bodies, each with its rule in the JSON schema too
(one definition): names and text (`Name`, `Text`, `EnvName`, `CommandLine`, `Argv`), numbers as JSON writes them
(`Integer`, `Number`), sizes and durations as people write them (`Bytes`, `Seconds`, `IdleSeconds`), and the
base model that refuses an unknown field with the closest known one (`Strict`).
"""

from __future__ import annotations

import difflib
import re
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    ValidationError,
    WithJsonSchema,
    WrapValidator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from gpuyard.shared.contracts.units import parse_duration, parse_size

NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
TEXT_PATTERN = r"^[^\x00]*$"
COMMAND_PATTERN = r"^[^\x00]*[^\x00\s][^\x00]*$"


def _refused_as(message: str) -> WrapValidator:
    """The check of a string that must match its pattern (`StringConstraints`, which the JSON schema carries
    too: one definition of the rule), refused with `message`. Every string of a spec has one: a NUL byte cannot
    reach exec, an environment or a path (C strings end at it), and the pattern also refuses a lone surrogate
    (text no store or answer can hold)."""

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

    return WrapValidator(check)


Name = Annotated[
    str,
    StringConstraints(pattern=NAME_PATTERN),
    _refused_as("use lowercase letters, digits and '-', start and end with a letter or digit, ≤ 63 chars"),
]
EnvName = Annotated[
    str,
    StringConstraints(pattern=ENV_NAME_PATTERN),
    _refused_as("an environment variable name is letters, digits and '_', not first a digit"),
]
Text = Annotated[str, StringConstraints(pattern=TEXT_PATTERN), _refused_as("must not contain a NUL byte")]
CommandLine = Annotated[
    str,
    StringConstraints(pattern=COMMAND_PATTERN),
    _refused_as("the command is empty or contains a NUL byte"),
]


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
