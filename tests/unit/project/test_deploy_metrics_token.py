"""The scrape token in the shipped deployments. The monitor's and serving's /metrics answer only a scrape that
carries the token of their `metrics_token_file`: every scrape job of a GPUYARD /metrics in every Prometheus
configuration under deploy/ sends it as a bearer token read from a file, and that file is the one the services
of that deployment read: the data dir's `secrets/metrics.token` for `gpuyard up`, and in Kubernetes the Secret
that every monitor and serving pod mounts read-only, where Prometheus mounts the same Secret. In docker compose
the monitor and serving share the token on one volume. The Secret as shipped refuses every scrape until it is
replaced, and a replaced or rotated one is read where it is mounted, nothing written there."""

from __future__ import annotations

import copy
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuyard.shared.auth.secretfile import METRICS_TOKEN_FILE, ScrapeAuth
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.supervisor.scrapeconfig import scrape_config
from tests.unit.project.test_deploy import (
    BASE,
    COMPOSE,
    METRICS_TOKEN_READERS,
    ROOT,
    TREE_IDS,
    TREES,
    WORKLOADS,
    Obj,
    load_yaml_documents,
    named,
    pod_environment,
    pod_spec,
    render,
    secret_behind,
    service_of,
    settings_from,
    shared_file_problems,
)

DEPLOY = ROOT / "deploy"
SCRAPE_CONFIGS = sorted(
    path
    for path in [*DEPLOY.rglob("*.yml"), *DEPLOY.rglob("*.yaml")]
    if any(isinstance(doc, dict) and "scrape_configs" in doc for doc in yaml.safe_load_all(path.read_text()))
)
"""Every Prometheus configuration shipped under deploy/."""
PROMETHEUS_SECRETS = Path("/etc/prometheus/secrets")
"""Where a Prometheus in Kubernetes has a Secret mounted, `<this>/<Secret>/<key>` (as the Prometheus Operator
mounts the Secrets its `secrets` names)."""
TOKEN_SECRET = BASE / "metrics-token-secret.yaml"
CHECKED_KEYS = ("authorization", "basic_auth", "bearer_token", "bearer_token_file", "oauth2")


def scrape_jobs(path: Path) -> list[Obj]:
    return yaml.safe_load(path.read_text())["scrape_configs"]


def up_data_dir(jobs: list[Obj]) -> Path:
    """The data dir of `gpuyard up` a configuration names: where the targets file of its file_sd job is."""
    folders = {Path(f).parent for job in jobs for sd in job.get("file_sd_configs", []) for f in sd["files"]}
    assert len(folders) == 1, f"the gpuyard up jobs name no one data dir: {folders}"
    return folders.pop()


def mounted_token(objects: list[Obj]) -> set[tuple[str, str]]:
    """(Secret, key) whose file each pod whose /metrics asks for the token reads it from, in one tree; the
    problems (a pod on no Secret, another Secret, a setting not set) are `shared_file_problems`'."""
    config = named(objects, "ConfigMap")["gpuyard-config"]["data"]
    found = set()
    for workload in (w for w in objects if w["kind"] in WORKLOADS and service_of(w) in METRICS_TOKEN_READERS):
        settings = settings_from(service_of(workload), pod_environment(workload, config))
        assert settings.metrics_auth == "token", workload["metadata"]["name"]
        behind = secret_behind(workload, Path(settings.metrics_token_file))
        assert not isinstance(behind, str), f"{workload['metadata']['name']}: {behind}"
        volume, key = behind
        found.add((volume["secret"]["secretName"], key))
    return found


def expected_token_files(jobs: list[Obj]) -> dict[str, Path]:
    """job name: the token's file it must send, where that deployment keeps it."""
    [(secret, key)] = set().union(*(mounted_token(objects) for _, objects in TREES))
    in_kubernetes = PROMETHEUS_SECRETS / secret / key
    up = up_data_dir([j for j in jobs if "kubernetes_sd_configs" not in j]) / METRICS_TOKEN_FILE
    return {j["job_name"]: in_kubernetes if "kubernetes_sd_configs" in j else up for j in jobs}


def token_problems(jobs: list[Obj]) -> list[str]:
    """What keeps a scrape job of a GPUYARD /metrics from sending the token the services read: no bearer
    authorization, a token written in the configuration, or a file other than the one that deployment keeps."""
    expected = expected_token_files(jobs)
    problems = []
    for job in jobs:
        name = job["job_name"]
        if not name.startswith("gpuyard-"):
            problems.append(f"{name}: not a GPUYARD job (the shipped configurations scrape only GPUYARD)")
            continue
        auth = {k: job[k] for k in CHECKED_KEYS if k in job}
        wanted = {"authorization": {"type": "Bearer", "credentials_file": str(expected[name])}}
        if auth != wanted:
            problems.append(f"{name}: sends {auth}, not {wanted}")
    return problems


# ---------------------------------------------------------------- Prometheus's configurations


def test_the_shipped_scrape_configurations_are_found():
    assert DEPLOY / "prometheus" / "prometheus.yml" in SCRAPE_CONFIGS


@pytest.mark.parametrize("path", SCRAPE_CONFIGS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_gpuyard_scrape_job_sends_the_token_its_deployment_keeps(path):
    jobs = scrape_jobs(path)
    assert not token_problems(jobs)
    kinds = {"kubernetes_sd_configs" in j for j in jobs}
    assert kinds == {True, False}, "a job for gpuyard up and one for Kubernetes pods"


def test_the_gpuyard_up_jobs_send_what_gpuyard_up_writes_for_its_data_dir():
    """`gpuyard/supervisor/scrapeconfig.py` writes the scrape configuration of one platform; the shipped one's jobs of
    the same name send the same authorization for the data dir it names."""
    jobs = {j["job_name"]: j for j in scrape_jobs(DEPLOY / "prometheus" / "prometheus.yml")}
    data_dir = up_data_dir(list(jobs.values()))
    written = scrape_config(
        "127.0.0.1:9400", data_dir / "prometheus-targets.json", data_dir / METRICS_TOKEN_FILE
    )
    for job in written["scrape_configs"]:
        assert jobs[job["job_name"]]["authorization"] == job["authorization"]
    defaults = [MonitorSettings(data_dir=data_dir), ServingSettings(data_dir=data_dir)]
    assert {s.metrics_auth for s in defaults} == {"token"}
    assert {s.metrics_token_file for s in defaults} == {None}  # (then the data dir's METRICS_TOKEN_FILE)


@pytest.mark.parametrize(
    "breakage", ["no authorization", "another file", "the token written in", "basic auth", "another job"]
)
def test_a_scrape_job_without_the_token_is_found(breakage):
    jobs = copy.deepcopy(scrape_jobs(DEPLOY / "prometheus" / "prometheus.yml"))
    job = next(j for j in jobs if j["job_name"] == "gpuyard-service-pods")
    if breakage == "no authorization":
        del job["authorization"]
    elif breakage == "another file":
        job["authorization"]["credentials_file"] = "/etc/prometheus/secrets/gpuyard-tokens/token"
    elif breakage == "the token written in":
        job["authorization"] = {"type": "Bearer", "credentials": "s3cret"}
    elif breakage == "basic auth":
        job["basic_auth"] = {
            "username": "prometheus",
            "password_file": job["authorization"]["credentials_file"],
        }
    else:
        job["job_name"] = "services"
    [problem] = token_problems(jobs)
    assert problem.startswith(job["job_name"])


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) is not installed")
@pytest.mark.parametrize("path", SCRAPE_CONFIGS, ids=lambda p: str(p.relative_to(DEPLOY)))
def test_promtool_accepts_the_configuration(path, tmp_path):
    """Prometheus's own check, its files here (promtool checks that a credentials_file exists). A build without
    Kubernetes discovery (Debian's) checks those jobs with a static target instead."""
    token, targets = tmp_path / "token", tmp_path / "targets.json"
    token.write_text(os.urandom(32).hex() + "\n")
    targets.write_text("[]\n")
    config = yaml.safe_load(path.read_text())
    for job in config["scrape_configs"]:
        job["authorization"]["credentials_file"] = str(token)
        for sd in job.get("file_sd_configs", []):
            sd["files"] = [str(targets)]

    def check(config: dict[str, Any]) -> subprocess.CompletedProcess:
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        return subprocess.run(
            ["promtool", "check", "config", str(tmp_path / "prometheus.yml")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    result = check(config)
    if "field kubernetes_sd_configs not found" in result.stdout + result.stderr:
        for job in config["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["static_configs"] = [{"targets": ["10.0.0.1:9400"]}]
        result = check(config)
    assert result.returncode == 0, result.stdout + result.stderr
    token.unlink()  # the check does look for the file
    assert check(config).returncode != 0


# ---------------------------------------------------------------- Kubernetes


@pytest.fixture(params=[objs for _, objs in TREES], ids=TREE_IDS)
def objects(request) -> list[Obj]:
    return copy.deepcopy(request.param)


def test_every_monitor_and_serving_pod_reads_the_token_of_one_secret_mounted_read_only(objects):
    assert not shared_file_problems(objects)
    readers = {
        service_of(w) for w in objects if w["kind"] in WORKLOADS and service_of(w) in METRICS_TOKEN_READERS
    }
    assert readers == {"monitor", "serving", "submit"}
    assert mounted_token(objects) == {("gpuyard-metrics-token", "token")}
    config = named(objects, "ConfigMap")["gpuyard-config"]["data"]
    assert config["GPUYARD_METRICS_TOKEN_FILE"] == "/etc/gpuyard/metrics/token"
    assert "GPUYARD_METRICS_AUTH" not in config  # token, the default


@pytest.mark.parametrize(
    "breakage", ["not mounted", "writable", "unreadable", "setting not set", "own Secret"]
)
def test_a_monitor_pod_that_would_make_or_miss_the_token_is_found(breakage):
    objects = render(BASE)
    [monitor] = [w for w in objects if w["kind"] in WORKLOADS and service_of(w) == "monitor"]
    spec = pod_spec(monitor)
    [mount] = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "metrics-token"]
    [volume] = [v for v in spec["volumes"] if v["name"] == "metrics-token"]
    if breakage == "not mounted":  # the file is then missing: the pod tries to make its own
        spec["containers"][0]["volumeMounts"].remove(mount)
    elif breakage == "writable":
        del mount["readOnly"]
    elif breakage == "unreadable":  # mode 0440, root's: only the fsGroup makes it the service's
        del spec["securityContext"]["fsGroup"]
    elif breakage == "setting not set":  # each pod would make its own token in its own data dir
        del named(objects, "ConfigMap")["gpuyard-config"]["data"]["GPUYARD_METRICS_TOKEN_FILE"]
    else:
        objects.append({**named(objects, "Secret")["gpuyard-metrics-token"], "metadata": {"name": "other"}})
        volume["secret"]["secretName"] = "other"
    problems = shared_file_problems(objects)
    assert any(p.startswith("gpuyard-monitor") or "different Secrets" in p for p in problems), problems


class KubeletSecretVolume:
    """A Secret's volume as the kubelet writes it: each key a link to `..data/<key>`, `..data` a link to a
    timestamped folder, replaced at once (a new folder, `..data` renamed over) when the Secret changes."""

    def __init__(self, root: Path, key: str):
        self.root, self.key, self.version = root, key, 0
        root.mkdir()
        (root / key).symlink_to(f"..data/{key}")

    def write(self, content: str) -> Path:
        self.version += 1
        folder = self.root / f"..2026_01_01_00_00_0{self.version}.000000000"
        folder.mkdir()
        (folder / self.key).write_text(content)
        (folder / self.key).chmod(0o440)  # defaultMode 0440
        (self.root / "..data_tmp").symlink_to(folder.name)
        os.replace(self.root / "..data_tmp", self.root / "..data")
        for old in self.root.glob("..2026_*"):
            if old != folder:
                shutil.rmtree(old)
        return self.root / self.key


def test_the_secret_as_shipped_refuses_every_scrape_and_a_replaced_or_rotated_one_is_the_token(
    tmp_path, caplog
):
    """Empty until replaced: every scrape is refused and the pod says why; with the token its comment says how to
    make, the pods answer it; rotated, they answer the new one only, read where it is mounted (no restart), and
    nothing is written there or in the data dir."""
    [secret] = load_yaml_documents(TOKEN_SECRET)
    text = TOKEN_SECRET.read_text()
    assert secret["metadata"]["name"] == "gpuyard-metrics-token"
    assert "create secret generic gpuyard-metrics-token" in text
    instruction = re.search(r'--from-literal=token="\$\(openssl rand -hex (\d+)\)"', text)
    assert instruction, "the Secret's comment says how to make the token"
    volume = KubeletSecretVolume(tmp_path / "metrics", "token")
    path = volume.write(secret["stringData"]["token"])
    data_dir = tmp_path / "data"
    settings = [
        MonitorSettings(data_dir=data_dir, metrics_token_file=path),
        ServingSettings(data_dir=data_dir, metrics_token_file=path),
    ]
    with caplog.at_level(logging.ERROR, logger="gpuyard.shared.auth.secretfile"):
        shipped = [ScrapeAuth.from_settings(s) for s in settings]
    assert "under 32 bytes" in caplog.text and str(path) in caplog.text
    assert not any(auth.allows("Bearer ") or auth.allows(None) for auth in shipped)

    def token() -> str:  # as `openssl rand -hex N` makes it, with its newline
        return os.urandom(int(instruction.group(1))).hex() + "\n"

    first = token()
    volume.write(first)
    auths = [ScrapeAuth.from_settings(s) for s in settings]
    assert all(auth.allows(f"Bearer {first.strip()}") for auth in [*auths, *shipped])
    second = token()
    volume.write(second)  # rotated: the same pods, the same file name
    for auth in [*auths, *shipped]:
        assert auth.allows(f"Bearer {second.strip()}") and not auth.allows(f"Bearer {first.strip()}")
    assert sorted(p.name for p in volume.root.iterdir()) == [
        "..2026_01_01_00_00_03.000000000",
        "..data",
        "token",
    ]
    assert not data_dir.exists()  # no token of its own made in the data dir


# ---------------------------------------------------------------- docker compose


def compose_file(service: str, path: Path) -> tuple[str, Path]:
    """(named volume, path on it) of a file of a compose service's container."""
    mounts = [v.split(":") for v in COMPOSE["services"][service].get("volumes", [])]
    on = [(source, target) for source, target, *_ in mounts if path.is_relative_to(target)]
    assert on, f"{service}: {path} is on no volume: each container would have its own"
    source, target = max(on, key=lambda m: len(m[1]))
    assert source in COMPOSE["volumes"], f"{service}: {source} is not a named volume"
    return source, path.relative_to(target)


def test_compose_gives_the_monitor_and_serving_one_token_on_a_volume_they_share():
    """Their containers' data dirs are their own unless a volume joins them: the token (made by the first to
    start where the setting or the data dir says) must be on one volume both mount, writable by the service's
    user (a new named volume takes its owner from the image's folder: the data dir is that user's home)."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    image_env = dict(re.findall(r"\b(GPUYARD_\w+)=(\S+)", dockerfile))
    where = {}
    for service in METRICS_TOKEN_READERS:
        variables = image_env | {k: str(v) for k, v in COMPOSE["services"][service]["environment"].items()}
        settings = settings_from(service, variables)
        assert settings.metrics_auth == "token", service
        path = settings.metrics_token_file or settings.data_dir / METRICS_TOKEN_FILE
        where[service] = compose_file(service, path)
        mounts = dict(v.split(":")[:2] for v in COMPOSE["services"][service]["volumes"])
        target = mounts[where[service][0]]
        assert re.search(rf"--home-dir {re.escape(target)} --create-home", dockerfile), target
    assert len(set(where.values())) == 1, where
    assert next(iter(where.values())) == ("web-data", Path(METRICS_TOKEN_FILE))
    assert not any("prometheus" in str(s.get("image", "")) for s in COMPOSE["services"].values()), (
        "a Prometheus in docker-compose.yml must mount web-data's token read-only and send it: test it here"
    )
