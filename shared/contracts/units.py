"""Parsing of human quantities used in job specs: sizes ("16GB", "512Mi") and durations ("2h", "90s")."""

from __future__ import annotations

import math
import re

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "m": 10**6,
    "mb": 10**6,
    "g": 10**9,
    "gb": 10**9,
    "t": 10**12,
    "tb": 10**12,
    "ki": 2**10,
    "kib": 2**10,
    "mi": 2**20,
    "mib": 2**20,
    "gi": 2**30,
    "gib": 2**30,
    "ti": 2**40,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")

_NUMBER = (int, float)  # (tuples: `int | float` would build a union on every call, and sizes are read often)
_NUMBER_OR_TEXT = (int, float, str)
_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_PART_RE = re.compile(r"(\d+(?:\.\d+)?)([smhd])")


def parse_size(value: int | float | str) -> int:
    """Return a size in bytes. Bare numbers are bytes; SI (GB) and binary (GiB, Gi) suffixes are accepted."""
    if isinstance(value, bool) or not isinstance(value, _NUMBER_OR_TEXT):
        raise ValueError("a size must be a number of bytes or a string such as '16GB'")
    if isinstance(value, _NUMBER):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("a size must be a finite number")
        if value < 0:
            raise ValueError("a size cannot be negative")
        return int(value)
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError(
            f"cannot read {value!r} as a size; write it like '16GB', '512MiB' or a number of bytes"
        )
    number, unit = match.groups()
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise ValueError(
            f"unknown size unit {unit!r} in {value!r}; use B, KB, MB, GB, TB, KiB, MiB, GiB or TiB"
        )
    return parse_size(float(number) * factor)


def parse_duration(value: int | float | str) -> float:
    """Return a duration in seconds. Bare numbers are seconds; '1h30m', '90s', '2d' are accepted."""
    if isinstance(value, bool) or not isinstance(value, _NUMBER_OR_TEXT):
        raise ValueError("a duration must be a number of seconds or a string such as '2h'")
    if isinstance(value, _NUMBER):
        seconds = float(value) if isinstance(value, float) or abs(value) < 2**53 else math.inf
        if not math.isfinite(seconds):
            raise ValueError("a duration must be a finite number")
        if seconds <= 0:
            raise ValueError("a duration must be positive")
        return seconds
    text = value.strip().lower().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return parse_duration(float(text))
    if not text or _DURATION_PART_RE.sub("", text):
        raise ValueError(f"cannot read {value!r} as a duration; write it like '90s', '45m', '2h' or '1h30m'")
    return parse_duration(sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART_RE.findall(text)))


_WRITTEN_UNITS = (
    ("TiB", 2**40), ("TB", 10**12), ("GiB", 2**30), ("GB", 10**9), ("MiB", 2**20), ("MB", 10**6),
    ("KiB", 2**10), ("kB", 10**3),
)  # fmt: skip


_WRITTEN_DIGITS = 10_000  # '1536 MiB' was written so; '24683652 KiB' (a node's memory, read in KiB) was not


def format_size(num_bytes: float) -> str:
    """Bytes as people write them, the one rendering everywhere: in the unit they were most likely written in
    when it divides them into at most four digits ('256 MB', '16 GiB', '1536 MiB'), else three figures in
    binary units ('1.5 GiB', '23.5 GiB', '900 B')."""
    num_bytes = int(num_bytes)
    for unit, factor in _WRITTEN_UNITS:
        if num_bytes >= factor and num_bytes % factor == 0 and num_bytes // factor < _WRITTEN_DIGITS:
            return f"{num_bytes // factor} {unit}"
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= factor:
            value = num_bytes / factor
            figures = f"{value:.3g}"  # (999.7 rounds to '1e+03': then the whole number, '1000 MiB')
            return f"{figures if 'e' not in figures else f'{value:.0f}'} {unit}"
    return f"{num_bytes} B"


def count_text(n: float, noun: str) -> str:
    """A count with its noun, the one rendering everywhere: '1 GPU', '2 GPUs', '0.5 GPU', '0 GPUs'."""
    return f"{n:g} {noun}" + ("" if 0 < n <= 1 else "s")


def format_duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s" if seconds % 60 else f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600}h"


def format_rough_duration(seconds: float) -> str:
    """A rough, human duration, as in "starts in about 40 min": '40 s', '12 min', '3.5 h', '2.0 days'."""
    seconds = max(0.0, seconds)
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 90 * 60:
        return f"{round(seconds / 60)} min"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
