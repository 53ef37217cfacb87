"""Settings: GPUYARD_* variables and flags, the tenant=number form, and a bad value as one clear line."""

from __future__ import annotations

import pytest

from services.scheduler.main import config_of, preflight
from shared.service import settings_from_argv
from shared.settings import ExecutorSettings, SchedulerSettings


def test_tenant_numbers_from_the_environment_and_flags(monkeypatch):
    monkeypatch.setenv("GPUYARD_QUOTAS", "vision=8, nlp=2.5")
    monkeypatch.setenv("GPUYARD_STREAM_REPLICAS", "3")
    settings = settings_from_argv(SchedulerSettings, ["--user-gpu-cap", "*=4"], "test")
    assert settings.quotas == {"vision": 8.0, "nlp": 2.5}
    assert settings.user_gpu_cap == {"*": 4.0}
    assert settings.stream_replicas == 3
    assert SchedulerSettings(tenant_weights='{"vision": 2}').tenant_weights == {"vision": 2.0}


def test_the_service_builds_the_core_config_from_its_settings():
    settings = SchedulerSettings(
        policy="fgd", preemption=False, min_runtime_before_preemption=0, backfill="off", tenant_weights="a=3"
    )
    config = config_of(settings)
    assert (config.policy, config.preemption, config.min_runtime_before_preemption, config.backfill) == (
        "fgd",
        False,
        0,
        "off",
    )
    assert config.tenant_weights == {"a": 3.0}
    assert SchedulerSettings().policy == "gpuyard"


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--quotas", "vision"], "quotas: Value error, expected tenant=number, got 'vision'"),
        (["--quotas", "vision=lots"], "quotas.vision"),
        (["--lease-ttl", "soon"], "lease_ttl"),
    ],
)
def test_a_bad_setting_is_one_line_and_exit_status_2(flags, expected, capsys):
    with pytest.raises(SystemExit) as exc:
        settings_from_argv(SchedulerSettings, flags, "test")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid settings" in err and expected in err and "Traceback" not in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--executor-worker", "1"], "executor_worker 1 is not below executor_workers 1"),
        (["--executor-workers", "2", "--executor-backend", "kubernetes"], "need the local backend"),
        (["--executor-workers", "0"], "executor_workers"),
    ],
)
def test_executor_workers_are_checked_at_start(flags, expected, capsys):
    with pytest.raises(SystemExit) as exc:
        settings_from_argv(ExecutorSettings, flags, "test")
    err = capsys.readouterr().err
    assert exc.value.code == 2 and expected in err and err.count("\n") == 1
    assert (
        settings_from_argv(
            ExecutorSettings, ["--executor-workers", "2", "--executor-worker", "1"], "t"
        ).executor_worker
        == 1
    )


@pytest.mark.parametrize(
    ("settings", "refusal"),
    [
        (SchedulerSettings(policy="random"), "unknown policy 'random'"),
        (SchedulerSettings(backfill="always"), "unknown backfill 'always'"),
        (SchedulerSettings(lease_ttl=0.1), "lease_ttl must be at least 1 second"),
        (SchedulerSettings(), None),
    ],
)
def test_the_scheduler_refuses_settings_it_cannot_run_with(settings, refusal):
    reason = preflight(settings)
    assert (reason is None) if refusal is None else (refusal in reason)
