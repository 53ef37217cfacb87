"""The alert rules: what each alert watches, its thresholds, and its two times, with the defaults a platform
starts with and the YAML file (`alert_rules`) that overrides them (docs/alerts.md).

Each rule has, as a Prometheus alerting rule has:
- `for`: how long its condition must hold before the alert is raised (pending until then);
- `keep_firing_for`: how long the condition must stay clear before the alert is resolved;
- and, where the condition is a figure, a raise threshold and a clear threshold apart from it: between the two
  (the dead band) a raised alert stays raised and a cleared one stays cleared, so a figure hovering around one
  threshold never flaps.

The file names only what it changes; every other rule and field keeps its default. An unknown rule or field,
or a value of the wrong kind, is refused with one line naming it (`RulesError`); the service then exits with
status 2 (`gpuyard.shared.settings.common.EXIT_REFUSED`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from gpuyard.shared.contracts.events.alerts import AlertKind, AlertSeverity
from gpuyard.shared.contracts.units import parse_duration

APPLICATION_XIDS = (13, 31, 43, 45, 68, 109)
"""The XIDs NVIDIA's Kubernetes device plugin ignores as application errors (internal/rm/health.go): the GPU is
still healthy, the job on it failed. Every other XID is fatal: the GPU needs a reset or more."""


def _duration_or_zero(value: object) -> object:
    """'90s', '30m', '1h30m', a number of seconds, or 0 ('0', '0s'): `gpuyard.shared.contracts.units.parse_duration` with zero."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
        return 0.0
    if isinstance(value, str) and value.strip().lower() in ("0", "0s", "0m", "0h"):
        return 0.0
    if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
        raise ValueError("a duration must be 0 or more")
    return parse_duration(value)  # type: ignore[arg-type]


Duration = Annotated[float, BeforeValidator(_duration_or_zero)]
Percent = Annotated[float, Field(ge=0, le=100)]


class Rule(BaseModel):
    """What every rule has."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    enabled: bool = True
    severity: AlertSeverity = AlertSeverity.WARNING
    for_: Duration = Field(0.0, alias="for", description="How long the condition holds before it is raised.")
    keep_firing_for: Duration = Field(
        0.0, description="How long the condition stays clear before the alert is resolved."
    )


class GpuIdleRule(Rule):
    """A GPU held by a job whose utilization stays below `below_pct` in every sample for `for`. Resolved when
    a sample reaches `clear_above_pct` (or the job lets the GPU go)."""

    for_: Duration = Field(1800.0, alias="for")
    below_pct: Percent = 5.0
    clear_above_pct: Percent = 10.0

    @model_validator(mode="after")
    def _band(self) -> GpuIdleRule:
        if self.clear_above_pct < self.below_pct:
            raise ValueError("clear_above_pct must be at least below_pct")
        return self


class GpuTemperatureRule(Rule):
    """A GPU at `above_c` °C or hotter for `for`; resolved once below `clear_below_c` for `keep_firing_for`."""

    for_: Duration = Field(60.0, alias="for")
    keep_firing_for: Duration = 60.0
    above_c: float = Field(85.0, gt=0, lt=200)
    clear_below_c: float = Field(80.0, gt=0, lt=200)

    @model_validator(mode="after")
    def _band(self) -> GpuTemperatureRule:
        if self.clear_below_c > self.above_c:
            raise ValueError("clear_below_c must be at most above_c")
        return self


class GpuPowerRule(Rule):
    """A GPU drawing at least `above_fraction` of its power limit (or `above_watts`, when given) for `for`;
    resolved once under `clear_below_fraction` (or `clear_below_watts`) for `keep_firing_for`."""

    for_: Duration = Field(60.0, alias="for")
    keep_firing_for: Duration = 60.0
    above_fraction: float = Field(1.0, gt=0, le=2)
    clear_below_fraction: float = Field(0.95, gt=0, le=2)
    above_watts: float | None = Field(None, gt=0)
    clear_below_watts: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _band(self) -> GpuPowerRule:
        if self.clear_below_fraction > self.above_fraction:
            raise ValueError("clear_below_fraction must be at most above_fraction")
        if (self.above_watts is None) != (self.clear_below_watts is None):
            raise ValueError("above_watts and clear_below_watts go together")
        if self.above_watts is not None and self.clear_below_watts > self.above_watts:  # type: ignore[operator]
            raise ValueError("clear_below_watts must be at most above_watts")
        return self


class GpuXidRule(Rule):
    """A fatal XID error on a GPU (any XID but the application ones): raised at once, resolved after
    `keep_firing_for` without another."""

    severity: AlertSeverity = AlertSeverity.CRITICAL
    keep_firing_for: Duration = 3600.0
    application_xids: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=lambda: list(APPLICATION_XIDS)
    )


class JobXidRule(Rule):
    """An application XID error (13, 31, 43, 45, 68, 109: the GPU is healthy, the job's code failed) on a
    GPU a job holds: one alert per job, resolved after `keep_firing_for` without another. The XIDs are
    `gpu_xid`'s `application_xids`."""

    keep_firing_for: Duration = 900.0


class GpuEccRule(Rule):
    """More than `above` uncorrectable ECC errors on a GPU since its driver loaded: raised at once, resolved
    when the count is back (a reset or a driver reload zeroes it)."""

    severity: AlertSeverity = AlertSeverity.CRITICAL
    above: int = Field(0, ge=0)


class GpuLostRule(Rule):
    """NVML reports a GPU lost (fallen off the bus); resolved once it reads again for `keep_firing_for`."""

    severity: AlertSeverity = AlertSeverity.CRITICAL
    keep_firing_for: Duration = 60.0


class NodeLostRule(Rule):
    """The scheduler lost a node's heartbeat (`node.lost`); resolved once its heartbeats are back for
    `keep_firing_for`."""

    severity: AlertSeverity = AlertSeverity.CRITICAL
    keep_firing_for: Duration = 30.0


class JobWaitingRule(Rule):
    """A job queued for longer than `for` (counted from when its current attempt was queued); resolved when it
    is placed, cancelled or gone."""

    for_: Duration = Field(1800.0, alias="for")


class JobSilentRule(Rule):
    """A running job that wrote no output and whose GPUs stayed below `gpu_below_pct` for `for`; resolved at
    its next output or GPU activity (at or above `gpu_below_pct`), or its end."""

    for_: Duration = Field(1800.0, alias="for")
    gpu_below_pct: Percent = 5.0


class Rules(BaseModel):
    """Every rule, by the alert kind it raises."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu_idle: GpuIdleRule = GpuIdleRule()
    gpu_temperature: GpuTemperatureRule = GpuTemperatureRule()
    gpu_power: GpuPowerRule = GpuPowerRule()
    gpu_xid: GpuXidRule = GpuXidRule()
    job_xid: JobXidRule = JobXidRule()
    gpu_ecc: GpuEccRule = GpuEccRule()
    gpu_lost: GpuLostRule = GpuLostRule()
    node_lost: NodeLostRule = NodeLostRule()
    job_waiting: JobWaitingRule = JobWaitingRule()
    job_silent: JobSilentRule = JobSilentRule()


KINDS = tuple(AlertKind(kind) for kind in Rules.model_fields)
"""The alert kinds the rules raise: each rule is named by its kind (a rule named otherwise fails here, at import)."""


class RulesError(ValueError):
    """A rules file the monitor refuses: one line naming the file, the rule and field, and why."""


def load_rules(path: Path | None) -> Rules:
    """The defaults, with what the YAML file at `path` changes (None: the defaults). Raises RulesError."""
    if path is None:
        return Rules()
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RulesError(f"alert rules {path}: cannot read it: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RulesError(f"alert rules {path}: not valid YAML: {' '.join(str(exc).split())}") from None
    return parse_rules(data, f"alert rules {path}")


def parse_rules(data: Any, origin: str = "alert rules") -> Rules:
    """`data` as the YAML file holds it: `{rules: {kind: {field: value}}}` (an empty file: the defaults)."""
    if data is None:
        return Rules()
    if not isinstance(data, dict) or set(data) - {"rules"}:
        extra = sorted(map(str, set(data) - {"rules"})) if isinstance(data, dict) else None
        found = f"unknown key(s) {', '.join(extra)}" if extra else f"a {type(data).__name__}"
        raise RulesError(f"{origin}: the file holds one mapping, 'rules:', not {found}")
    rules = data.get("rules") or {}
    if not isinstance(rules, dict):
        raise RulesError(f"{origin}: 'rules' must map rule names ({', '.join(KINDS)}) to their fields")
    for kind, fields in rules.items():
        if kind not in KINDS:
            raise RulesError(f"{origin}: unknown rule {kind!r}; the rules are {', '.join(KINDS)}")
        if fields is not None and not isinstance(fields, dict):
            raise RulesError(f"{origin}: rule {kind}: give its fields as a mapping, not {fields!r}")
    try:
        return Rules.model_validate({kind: fields or {} for kind, fields in rules.items()})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        problem = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            kind = str(first["loc"][0])
            known = ", ".join(
                f.alias or name for name, f in type(getattr(Rules(), kind)).model_fields.items()
            )
            problem = f"unknown field; {kind} has {known}"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise RulesError(f"{origin}: {where}: {problem}{more}") from None


def rules_refusal(settings: Any) -> str | None:
    """Why the monitor refuses its `alert_rules` file (the `preflight` of `gpuyard.shared.runtime.service.run_service`), or
    None when it loads."""
    try:
        load_rules(getattr(settings, "alert_rules", None))
    except RulesError as exc:
        return str(exc)
    return None
