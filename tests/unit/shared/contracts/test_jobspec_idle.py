"""The job spec's idle-GPU reclaim fields (`idle_timeout`, `idle_grace`) and the monitor's settings for it: read
like every duration, 0 or 'off' to turn it off, refused with a message that says what to write (a 422 naming
the field from the API)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.settings.monitor import MonitorSettings
from tests.unit.services.submit.test_submit_api import SPEC, VISION, api, ctx  # noqa: F401 (fixtures)


def spec(**fields) -> JobSpec:
    return JobSpec.model_validate({"command": "python train.py", **fields})


@pytest.mark.parametrize(
    "given, seconds",
    [("30m", 1800.0), (90, 90.0), ("1h30m", 5400.0), ("2.5", 2.5), (0, 0.0), ("off", 0.0), ("never", 0.0)],
)
def test_idle_durations_read_like_every_duration_and_0_or_off_turns_it_off(given, seconds):
    assert spec(idle_timeout=given).idle_timeout == seconds
    assert spec(idle_grace=given).idle_grace == seconds


def test_unset_means_the_tenant_default_and_the_platform_grace():
    job = spec()
    assert job.idle_timeout is None and job.idle_grace is None


@pytest.mark.parametrize(
    "given, words",
    [
        ("soon", "cannot read 'soon' as a duration; write it like '90s', '45m', '2h' or '1h30m'"),
        (-5, "a duration must be positive"),
        ("31d", "at most 30 days, or 'off'"),
        (True, "a duration must be a number of seconds"),
    ],
)
def test_a_bad_idle_duration_is_refused_with_what_to_write(given, words):
    for field in ("idle_timeout", "idle_grace"):
        with pytest.raises(ValidationError) as refused:
            spec(**{field: given})
        [error] = refused.value.errors()
        assert error["loc"] == (field,) and words in error["msg"]


def test_a_serve_job_is_never_stopped_for_idle_gpus():
    with pytest.raises(ValidationError, match="a serve job is never stopped for idle GPUs"):
        JobSpec.model_validate({"serve": {"model": "m", "version": 1}, "idle_timeout": "30m"})
    assert JobSpec.model_validate({"serve": {"model": "m", "version": 1}, "idle_timeout": "off"})


def test_the_api_answers_422_naming_the_field_and_keeps_a_good_one(api):  # noqa: F811
    refused = api.post("/v1/jobs", json={**SPEC, "idle_timeout": "a while"}, headers=VISION)
    assert refused.status_code == 422
    [error] = refused.json()["detail"]
    assert error["loc"][-1] == "idle_timeout" and "write it like '90s'" in error["msg"]
    accepted = api.post("/v1/jobs", json={**SPEC, "idle_timeout": "30m", "idle_grace": "5m"}, headers=VISION)
    assert accepted.status_code == 202, accepted.text
    job = api.get(f"/v1/jobs/{accepted.json()['job_id']}", headers=VISION).json()
    assert job["spec"]["idle_timeout"] == 1800 and job["spec"]["idle_grace"] == 300


def test_the_monitor_settings_read_tenant_defaults_as_durations(monkeypatch):
    monkeypatch.setenv("GPUYARD_IDLE_TIMEOUTS", "vision=30m, nlp=off, *=2h")
    monkeypatch.setenv("GPUYARD_IDLE_MIN_AGE", "0")
    settings = MonitorSettings()
    assert settings.idle_timeouts == {"vision": 1800.0, "nlp": 0.0, "*": 7200.0}
    assert settings.idle_min_age == 0 and settings.idle_threshold_pct == 5.0 and settings.idle_grace == 600
    monkeypatch.setenv("GPUYARD_IDLE_TIMEOUTS", "vision=lots")
    with pytest.raises(ValidationError, match="cannot read 'lots' as a duration"):
        MonitorSettings()
