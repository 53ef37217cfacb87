"""Reading a job spec file: YAML or JSON text to a dict (not yet validated: `JobSpec` does that), every way it
can go wrong a `SpecError` in words for people, naming the file and where in it (`gpuyard submit job.yaml`, and
the submit API's YAML bodies).
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import yaml


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
