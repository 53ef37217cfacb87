"""How a setting is named where people type it: its GPUYARD_* variable, its flag, its default as written."""

from __future__ import annotations

from enum import Enum

from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gpuyard.shared.settings.common import ENV_PREFIX


def env_name(name: str, nested_in: str = "") -> str:
    return f"{ENV_PREFIX}{nested_in}{'_' if nested_in else ''}{name}".upper()


def flag_name(name: str, nested_in: str = "") -> str:
    return f"--{nested_in}{'.' if nested_in else ''}{name}".replace("_", "-")


def default_text(field: FieldInfo) -> str:
    """The default as one writes it in a variable; what a factory computes is in the description."""
    if field.default is PydanticUndefined:
        return "empty" if field.default_factory in (dict, list) else "see description"
    value = field.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if value is None or value == "":
        return "empty"
    return f"`{value}`"
