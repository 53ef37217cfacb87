"""Settings: GPUYARD_* variables and flags from one declaration (flags first), the tenant=number form, the
Kubernetes backend's nested settings, a bad value as one clear line, what `gpuyard up` hands each service,
and the settings tables of docs/operations.md."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import pytest
from pydantic import BaseModel

from gpuyard.cli import build_parser
from gpuyard.client import Client, config_dir
from gpuyard.docsgen import settings as settingsdocs
from gpuyard.services.scheduler.service import config_of
from gpuyard.shared.contracts.policies import BackfillMode, Policy
from gpuyard.shared.runtime.service import event_loop_factory
from gpuyard.shared.scheduling import SchedulerConfig
from gpuyard.shared.settings.client import ClientSettings
from gpuyard.shared.settings.common import CommonSettings, settings_from_argv
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.settings.kubernetes import FractionalGpuMode, KubernetesConfig, OwnerTarget
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.scheduler import SchedulerSettings
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.shared.settings.submit import SubmitSettings
from gpuyard.supervisor.options import SETTING_FLAGS, UpOptions
from gpuyard.supervisor.options import add_arguments as add_up_arguments
from gpuyard.supervisor.plan import plan

MODELS = (
    CommonSettings,
    SubmitSettings,
    SchedulerSettings,
    ExecutorSettings,
    MonitorSettings,
    ServingSettings,
    ClientSettings,
    KubernetesConfig,
    OwnerTarget,
)


@pytest.fixture(autouse=True)
def no_gpuyard_variables(monkeypatch):
    """Each test starts from an environment without GPUYARD_* variables, whatever the shell exported."""
    for name in [n for n in os.environ if n.startswith("GPUYARD_")]:
        monkeypatch.delenv(name)


def one_line_refusal(capsys, excinfo) -> str:
    err = capsys.readouterr().err
    assert excinfo.value.code == 2 and "Traceback" not in err
    assert err.count("\n") == 1, err
    return err


# ---------------------------------------------------------------- variables and flags


def test_tenant_numbers_from_the_environment_and_flags(monkeypatch):
    monkeypatch.setenv("GPUYARD_QUOTAS", "vision=8, nlp=2.5")
    monkeypatch.setenv("GPUYARD_STREAM_REPLICAS", "3")
    settings = settings_from_argv(SchedulerSettings, ["--user-gpu-cap", "*=4"], "test")
    assert settings.quotas == {"vision": 8.0, "nlp": 2.5}
    assert settings.user_gpu_cap == {"*": 4.0}
    assert settings.stream_replicas == 3
    assert SchedulerSettings(tenant_weights='{"vision": 2}').tenant_weights == {"vision": 2.0}


def test_a_flag_wins_over_its_variable(monkeypatch):
    monkeypatch.setenv("GPUYARD_POLICY", "bestfit")
    monkeypatch.setenv("GPUYARD_PREEMPTION", "false")
    assert settings_from_argv(SchedulerSettings, [], "test").policy is Policy.BESTFIT
    flagged = settings_from_argv(SchedulerSettings, ["--policy", "fgd", "--preemption", "true"], "test")
    assert (flagged.policy, flagged.preemption) == (Policy.FGD, True)
    assert (
        flagged.preemption is True and flagged.borrowing is True
    )  # the model's default where neither is set


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
    assert SchedulerSettings().policy is Policy.GPUYARD and SchedulerSettings().backfill is BackfillMode.EASY
    assert config_of(SchedulerSettings(reservation_depth=3)).reservation_depth == 3
    assert config_of(SchedulerSettings()).reservation_depth == SchedulerConfig().reservation_depth
    off = config_of(SchedulerSettings(short_first_window=0, shape_reservations=0))
    assert (off.short_first_window, off.shape_reservations) == (0, 0)
    default = config_of(SchedulerSettings())
    assert (default.short_first_window, default.shape_reservations) == (
        SchedulerConfig().short_first_window,
        SchedulerConfig().shape_reservations,
    )


def test_ports_of_serving_and_the_monitor():
    assert ServingSettings().serving_port == 8000  # Triton's HTTP port
    assert MonitorSettings().metrics_port == 9400


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--quotas", "vision"], "quotas: Value error, expected tenant=number, got 'vision'"),
        (["--quotas", "vision=lots"], "quotas.vision"),
        (["--lease-ttl", "soon"], "lease_ttl"),
        (["--policy", "random"], "policy: Input should be 'gpuyard', 'fgd', 'bestfit' or 'firstfit'"),
        (["--backfill", "always"], "backfill: Input should be 'easy', 'greedy' or 'off'"),
        (["--fair-share", "maybe"], "fair_share"),
        (["--no-such-setting", "1"], "unrecognized arguments: --no-such-setting"),
        (["--policy"], "argument --policy: expected one argument"),
    ],
)
def test_a_bad_flag_is_one_line_and_exit_status_2(flags, expected, capsys):
    with pytest.raises(SystemExit) as excinfo:
        settings_from_argv(SchedulerSettings, flags, "test")
    err = one_line_refusal(capsys, excinfo)
    assert err.startswith("test: ") and expected in err


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("GPUYARD_POLICY", "random", "policy: Input should be 'gpuyard', 'fgd', 'bestfit' or 'firstfit'"),
        ("GPUYARD_EVENT_LOOP", "trio", "event_loop: Input should be 'uvloop' or 'asyncio'"),
        ("GPUYARD_KUBERNETES_MASTER_PORT", "0", "kubernetes.master_port"),
        ("GPUYARD_KUBERNETES_TOLERATIONS", "[not json", "kubernetes"),
    ],
)
def test_a_bad_variable_is_one_line_and_exit_status_2(variable, value, expected, monkeypatch, capsys):
    monkeypatch.setenv(variable, value)
    model = SchedulerSettings if variable in ("GPUYARD_POLICY", "GPUYARD_EVENT_LOOP") else ExecutorSettings
    with pytest.raises(SystemExit) as excinfo:
        settings_from_argv(model, [], "test")
    assert expected in one_line_refusal(capsys, excinfo)


PORTS = [  # every port setting, and whether 0 (any free port, as its description says) is allowed
    (SubmitSettings, "submit_port", False),
    (ServingSettings, "serving_port", False),
    (MonitorSettings, "metrics_port", True),
    (CommonSettings, "health_port", True),
    (CommonSettings, "service_metrics_port", True),
    (ExecutorSettings, "gateway_port", True),
]


@pytest.mark.parametrize(("model", "name", "any_port"), PORTS)
@pytest.mark.parametrize("value", ["99999", "65536", "-1", "0"])
def test_a_port_setting_out_of_range_is_one_line_and_never_another_port(
    model, name, any_port, value, monkeypatch, capsys
):
    monkeypatch.setenv(settingsdocs.env_name(name), value)
    if value == "0" and any_port:
        assert getattr(settings_from_argv(model, [], "test"), name) == 0
        assert "0 picks a free one" in model.model_fields[name].description
        return
    with pytest.raises(SystemExit) as excinfo:
        settings_from_argv(model, [], "test")
    assert f"test: invalid settings: {name}: Input should be" in one_line_refusal(capsys, excinfo)


@pytest.mark.parametrize(("model", "name", "any_port"), PORTS)
def test_every_port_from_1_to_65535_is_taken(model, name, any_port):
    for port in (1, 8000, 65535):
        assert (
            getattr(settings_from_argv(model, [f"--{name.replace('_', '-')}", str(port)], "t"), name) == port
        )


def test_every_port_setting_is_in_the_table_above():
    named = {name for model in MODELS for name in model.model_fields if name.endswith("_port")}
    assert named - {"master_port"} == {name for _, name, _ in PORTS}  # (the Kubernetes one: its own test)


def test_a_service_refuses_a_port_out_of_range_in_one_line_before_it_starts(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUYARD_")}
    env |= {"GPUYARD_SERVING_PORT": "99999", "GPUYARD_DATA_DIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "gpuyard.services.serving"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "python -m gpuyard.services.serving: invalid settings: serving_port: Input should be less than or equal to 65535"
    ]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--executor-worker", "1"], "executor_worker 1 is not below executor_workers 1"),
        (["--executor-workers", "2", "--executor-backend", "kubernetes"], "need the local backend"),
        (["--executor-workers", "0"], "executor_workers"),
    ],
)
def test_executor_workers_are_checked_at_start(flags, expected, capsys):
    with pytest.raises(SystemExit) as excinfo:
        settings_from_argv(ExecutorSettings, flags, "test")
    assert expected in one_line_refusal(capsys, excinfo)
    two = settings_from_argv(ExecutorSettings, ["--executor-workers", "2", "--executor-worker", "1"], "t")
    assert two.executor_worker == 1


def test_the_scheduler_refuses_a_lease_shorter_than_a_second(capsys):
    with pytest.raises(SystemExit) as excinfo:
        settings_from_argv(SchedulerSettings, ["--lease-ttl", "0.1"], "test")
    assert "lease_ttl" in one_line_refusal(capsys, excinfo)
    assert settings_from_argv(SchedulerSettings, [], "test").lease_ttl == 10


def test_the_event_loop_setting():
    assert event_loop_factory("asyncio") is None
    assert CommonSettings().event_loop == "uvloop"


# ---------------------------------------------------------------- the Kubernetes backend


def test_kubernetes_settings_keep_their_variable_names(monkeypatch):
    monkeypatch.setenv("GPUYARD_EXECUTOR_BACKEND", "kubernetes")
    monkeypatch.setenv("GPUYARD_KUBERNETES_NAMESPACE", "jobs")
    monkeypatch.setenv("GPUYARD_KUBERNETES_IMAGE_PULL_POLICY", "Always")
    monkeypatch.setenv("GPUYARD_KUBERNETES_FRACTIONAL_GPU_MODE", "shared")
    monkeypatch.setenv("GPUYARD_KUBERNETES_POLL_INTERVAL", "0.5")
    monkeypatch.setenv("GPUYARD_KUBERNETES_EXTRA_LABELS", '{"team": "research"}')
    monkeypatch.setenv("GPUYARD_KUBERNETES_DEFAULT_GPU_MEMORY", "80GiB")
    monkeypatch.setenv(
        "GPUYARD_KUBERNETES_OWNER",
        '{"api_version": "apps/v1", "kind": "Deployment", "name": "e", "uid": "u1"}',
    )
    monkeypatch.setenv("GPUYARD_KUBECONFIG", "/etc/kube.conf")
    settings = settings_from_argv(ExecutorSettings, ["--kubernetes.namespace", "other"], "test")
    kube = settings.kubernetes
    assert kube.namespace == "other"  # the flag over the variable
    assert kube.image_pull_policy == "Always" and kube.fractional_gpu_mode is FractionalGpuMode.SHARED
    assert kube.poll_interval == 0.5 and kube.log_interval == 5.0
    assert kube.extra_labels == {"team": "research"} and kube.default_gpu_memory == 80 * 2**30
    assert kube.owner == OwnerTarget(api_version="apps/v1", kind="Deployment", name="e", uid="u1")
    assert settings.kubeconfig == "/etc/kube.conf"


def test_without_kubernetes_variables_the_backend_has_the_models_defaults():
    assert ExecutorSettings().kubernetes == KubernetesConfig()
    assert KubernetesConfig().namespace == "default" and KubernetesConfig().poll_interval == 2.0


# ---------------------------------------------------------------- the CLI client


def test_the_client_reads_its_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUYARD_CONFIG_DIR", str(tmp_path))
    monkeypatch.setenv("GPUYARD_SERVER", "http://api.example:9000/")
    monkeypatch.setenv("GPUYARD_TOKEN", "gy_secret")
    assert config_dir() == tmp_path
    client = Client()
    assert client.server == "http://api.example:9000" and client.token == "gy_secret"
    assert Client("http://other:1", "flag-token").token == "flag-token"  # flags first
    assert ClientSettings().server == "http://api.example:9000/"


# ---------------------------------------------------------------- what `gpuyard up` hands each service


def up_plan(*flags: str, executors: int = 2):
    args = build_parser().parse_args(["up", *flags, "--executors", str(executors)])
    return plan(UpOptions.from_args(args), dict(os.environ))


@pytest.mark.parametrize(("cores", "executors"), [(1, 1), (2, 1), (3, 2), (64, 2), (None, 1)])
def test_up_starts_a_second_executor_only_where_more_than_two_cores_can_carry_it(
    monkeypatch, cores, executors
):
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    args = build_parser().parse_args(["up"])
    assert args.executors == UpOptions.from_args(args).executors == executors


def as_the_child_reads_it(child, monkeypatch):
    """The settings a service process builds from its argv and environment, as `python -P -m gpuyard.services.X`
    does."""
    assert child.argv[:4] == [sys.executable, "-P", "-m", f"gpuyard.services.{child.service or child.name}"]
    monkeypatch.setattr(os, "environ", dict(child.env))
    model = {"submit": SubmitSettings, "scheduler": SchedulerSettings, "executor": ExecutorSettings}.get(
        child.service or child.name, MonitorSettings if child.name == "monitor" else ServingSettings
    )
    return settings_from_argv(model, child.argv[4:], child.name)


def child(platform, name):
    return next(c for c in platform.children if c.name == name)


@pytest.mark.parametrize(
    ("variable", "flags", "policy"),
    [
        (None, [], Policy.GPUYARD),  # the scheduler's own default
        ("bestfit", [], Policy.BESTFIT),  # what the user exported reaches it
        (None, ["--policy", "fgd"], Policy.FGD),
        ("bestfit", ["--policy", "fgd"], Policy.FGD),  # up's flag over the variable
    ],
)
def test_up_gives_the_scheduler_the_policy_asked_for(variable, flags, policy, monkeypatch, tmp_path):
    if variable:
        monkeypatch.setenv("GPUYARD_POLICY", variable)
    platform = up_plan("--data-dir", str(tmp_path), *flags)
    scheduler = child(platform, "scheduler")
    assert scheduler.env.get("GPUYARD_POLICY") == variable  # the environment passes unchanged
    assert as_the_child_reads_it(scheduler, monkeypatch).policy is policy
    assert platform.settings["scheduler"].policy is policy


def test_up_passes_only_the_flags_given_and_each_to_the_services_that_have_it(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUYARD_SIMULATE_GPUS", "3")
    monkeypatch.setenv("GPUYARD_SERVING_PORT", "18000")
    platform = up_plan("--data-dir", str(tmp_path / "d"), "--monitor-port", "19400", "--node-name", "n1")
    data_dir = (tmp_path / "d").resolve()
    assert platform.data_dir == data_dir
    for c in platform.children:
        settings = as_the_child_reads_it(c, monkeypatch)
        assert settings.data_dir == data_dir
        assert settings.nats_url == "nats://127.0.0.1:4222"  # up's own NATS
    executors = [c for c in platform.children if c.service == "executor"]
    assert [c.name for c in executors] == ["executor", "executor-1"]
    for worker, c in enumerate(executors):
        settings = as_the_child_reads_it(c, monkeypatch)
        assert (settings.executor_workers, settings.executor_worker) == (2, worker)
        assert (settings.node_name, settings.simulate_gpus) == ("n1", 3)  # flag; variable
    assert as_the_child_reads_it(child(platform, "monitor"), monkeypatch).metrics_port == 19400
    assert as_the_child_reads_it(child(platform, "serving"), monkeypatch).serving_port == 18000
    assert "--monitor-port" not in child(platform, "serving").argv
    assert "--metrics-port" not in child(platform, "serving").argv  # not a serving setting
    assert (
        as_the_child_reads_it(child(platform, "submit"), monkeypatch).tokens_file == data_dir / "tokens.json"
    )
    assert "--policy" not in child(platform, "scheduler").argv  # not given: not passed


def test_up_without_flags_runs_every_service_on_its_own_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUYARD_DATA_DIR", str(tmp_path))
    platform = up_plan(executors=1)
    assert platform.data_dir == tmp_path.resolve()  # the variable, as the services would read it
    assert platform.submit.submit_port == SubmitSettings.model_fields["submit_port"].default
    assert platform.settings["serving"].serving_port == 8000
    assert platform.settings["monitor"].metrics_port == 9400
    assert platform.executor.simulate_gpus == 0 and platform.executor.executor_workers == 1


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--policy", "random"], "gpuyard up: scheduler: invalid settings: policy: Input should be"),
        (["--port", "api"], "gpuyard up: invalid settings: submit_port"),
        (["--executors", "0"], "executor_workers: Input should be greater than or equal to 1"),
        (["--executors", "65"], "executor_workers: Input should be less than or equal to 64"),
    ],
)
def test_up_refuses_a_bad_setting_in_one_line_before_starting_anything(flags, expected, capsys, tmp_path):
    args = build_parser().parse_args(["up", "--data-dir", str(tmp_path / "d"), *flags])
    with pytest.raises(SystemExit) as excinfo:
        plan(UpOptions.from_args(args), dict(os.environ))
    assert expected in one_line_refusal(capsys, excinfo)
    assert not (tmp_path / "d").exists()


def test_up_flags_describe_the_settings_they_set():
    parser = argparse.ArgumentParser(prog="gpuyard up")
    add_up_arguments(parser)
    help_text = " ".join(parser.format_help().split())
    for flag, (model, name) in SETTING_FLAGS.items():
        assert flag in help_text and f"${settingsdocs.env_name(name)}" in help_text
        assert " ".join(model.model_fields[name].description.split()) in help_text
    assert "Not given: $GPUYARD_POLICY, else gpuyard." in help_text


# ---------------------------------------------------------------- declarations and docs


@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.__name__)
def test_every_setting_is_described(model: type[BaseModel]):
    undescribed = [name for name, field in model.model_fields.items() if not field.description]
    assert not undescribed


def test_the_docs_list_every_setting_as_the_models_declare_it():
    text = settingsdocs.DOC.read_text()
    assert settingsdocs.with_tables(text) == text, (
        "docs/operations.md is stale: run python -m gpuyard.docsgen.settings"
    )
    tables = text.split(settingsdocs.BEGIN)[1].split(settingsdocs.END)[0]
    for table in settingsdocs.TABLES:
        for name in table.model.model_fields:
            if name not in table.skip:
                assert f"`{settingsdocs.env_name(name, table.nested_in)}`" in tables
    assert (
        "| `GPUYARD_KUBERNETES_IMAGE_PULL_POLICY` | `--kubernetes.image-pull-policy` | `IfNotPresent` |"
        in tables
    )
    assert "| `GPUYARD_POLICY` | `--policy` | `gpuyard` |" in tables


def test_the_docs_check_fails_when_the_tables_differ(monkeypatch, tmp_path, capsys):
    stale = tmp_path / "operations.md"
    stale.write_text(
        settingsdocs.DOC.read_text().replace("`--policy` | `gpuyard`", "`--policy` | `firstfit`")
    )
    monkeypatch.setattr(settingsdocs, "DOC", stale)
    assert settingsdocs.main(["--check"]) == 1
    assert settingsdocs.main([]) == 0 and settingsdocs.main(["--check"]) == 0
    assert "`--policy` | `gpuyard`" in stale.read_text()
