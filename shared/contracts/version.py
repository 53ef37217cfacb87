"""GPUYARD's version: the installed package's, as pyproject.toml declares it (its one definition)."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("gpuyard")
except PackageNotFoundError:  # run from a checkout that was never installed
    VERSION = "0+unknown"
