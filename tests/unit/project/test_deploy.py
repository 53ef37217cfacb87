"""The deployment files: the kustomize tree rendered without kustomize and checked against the Kubernetes
OpenAPI schema (offline) and against itself; docker-compose.yml, the Dockerfile and .dockerignore by structure.

`render` is a small kustomize: `resources` (files and directories), `namespace`, `images` and `replicas`.
It refuses any other kustomization field, so an overlay that outgrows it fails here instead of being checked
half. Where `kubectl` is installed its real kustomize must render the same objects.
"""

from __future__ import annotations

import base64
import copy
import json
import logging
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gpuyard.docsgen.settings import TABLES
from gpuyard.shared.auth import sessions
from gpuyard.shared.auth.jobtokens import SECRETS_DIR
from gpuyard.shared.runtime.servicemetrics import METRICS_PATH
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.settings.monitor import MonitorSettings
from gpuyard.shared.settings.names import env_name
from gpuyard.shared.settings.serving import ServingSettings
from gpuyard.supervisor.servicecommands import SERVICES as SERVICE_SETTINGS

ROOT = Path(__file__).resolve().parents[3]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
BASE = KUSTOMIZE / "base"
OVERLAYS = sorted(p.parent for p in (KUSTOMIZE / "overlays").glob("*/kustomization.yaml"))
ALTERNATIVES = sorted((KUSTOMIZE / "alternatives").glob("*.yaml"))
K8S_VERSION = "1.33"
HEALTH_PORT = 8090
SERVICES = ("submit", "scheduler", "executor", "serving", "monitor")
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PriorityClass", "StorageClass"}
SUPPORTED_FIELDS = {"apiVersion", "kind", "resources", "namespace", "images", "replicas"}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "Job"}

Obj = dict[str, Any]


# ---------------------------------------------------------------- a tiny kustomize


def load_yaml_documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def render(directory: Path) -> list[Obj]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - SUPPORTED_FIELDS
    assert not unsupported, f"{directory}: the test's renderer does not implement {sorted(unsupported)}"
    objects: list[Obj] = []
    for entry in kustomization.get("resources", []):
        path = (directory / entry).resolve()
        objects += render(path) if path.is_dir() else load_yaml_documents(path)
    objects = copy.deepcopy(objects)
    if "namespace" in kustomization:
        set_namespace(objects, kustomization["namespace"])
    for image in kustomization.get("images", []):
        set_image(objects, image)
    for replicas in kustomization.get("replicas", []):
        set_replicas(objects, replicas["name"], replicas["count"])
    return objects


def set_namespace(objects: list[Obj], namespace: str) -> None:
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace
        for subject in obj.get("subjects", []):
            if subject.get("kind") == "ServiceAccount" and subject.get("namespace") in (None, "default"):
                subject["namespace"] = namespace


def set_image(objects: list[Obj], rule: dict[str, str]) -> None:
    for container in all_containers(objects):
        name, _, tag = container["image"].partition(":")
        if name == rule["name"]:
            container["image"] = f"{rule.get('newName', name)}:{rule.get('newTag', tag)}".rstrip(":")


def set_replicas(objects: list[Obj], name: str, count: int) -> None:
    matched = [o for o in objects if o["metadata"]["name"] == name and "replicas" in o.get("spec", {})]
    assert matched, f"replicas: nothing named {name}"
    for obj in matched:
        obj["spec"]["replicas"] = count


# ---------------------------------------------------------------- walking objects


def pod_spec(obj: Obj) -> Obj | None:
    return obj["spec"]["template"]["spec"] if obj["kind"] in WORKLOADS else None


def pod_labels(obj: Obj) -> dict[str, str]:
    return obj["spec"]["template"]["metadata"].get("labels", {})


def containers_of(obj: Obj) -> list[Obj]:
    spec = pod_spec(obj)
    return [] if spec is None else spec.get("initContainers", []) + spec["containers"]


def all_containers(objects: list[Obj]) -> Iterator[Obj]:
    for obj in objects:
        yield from containers_of(obj)


def named(objects: list[Obj], kind: str) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def trees() -> list[tuple[str, list[Obj]]]:
    rendered = [(f"overlays/{p.name}", render(p)) for p in OVERLAYS]
    return [("base", render(BASE)), *rendered]


TREES = trees()
TREE_IDS = [name for name, _ in TREES]


@pytest.fixture(params=[objs for _, objs in TREES], ids=TREE_IDS)
def objects(request) -> list[Obj]:
    return request.param


# ---------------------------------------------------------------- schema


def test_there_is_an_overlay():
    assert OVERLAYS, "deploy/kubernetes/overlays/* is empty"


def test_every_object_is_schema_valid(objects):
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_alternative_manifests_are_schema_valid():
    assert ALTERNATIVES
    for path in ALTERNATIVES:
        for obj in load_yaml_documents(path):
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_no_duplicate_objects(objects):
    keys = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert len(keys) == len(set(keys))


def test_overlay_sets_namespace_images_and_replicas():
    dev = next(objs for name, objs in TREES if name == "overlays/dev")
    namespaced = [o for o in dev if o["kind"] not in CLUSTER_SCOPED]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"gpuyard-dev"}
    assert named(dev, "Namespace").keys() == {"gpuyard-dev"}
    gpuyard_images = {c["image"] for c in all_containers(dev) if "gpuyard" in c["image"]}
    assert gpuyard_images == {"gpuyard:dev"}
    assert named(dev, "Deployment")["gpuyard-scheduler"]["spec"]["replicas"] == 1
    binding = named(dev, "RoleBinding")["gpuyard-executor"]
    assert binding["subjects"][0]["namespace"] == "gpuyard-dev"
    cluster_binding = named(dev, "ClusterRoleBinding")["gpuyard-executor-nodes"]
    assert cluster_binding["subjects"][0]["namespace"] == "gpuyard-dev"
    assert "namespace" not in cluster_binding["metadata"]


# ---------------------------------------------------------------- cross references


def test_every_service_selects_some_pods(objects):
    workloads = [o for o in objects if o["kind"] in WORKLOADS]
    for service in named(objects, "Service").values():
        selector = service["spec"]["selector"]
        targets = [w for w in workloads if selector.items() <= pod_labels(w).items()]
        assert targets, f"Service {service['metadata']['name']} selects no pod template"
        for port in service["spec"]["ports"]:
            target = port.get("targetPort", port["port"])
            ports = [p for w in targets for c in containers_of(w) for p in c.get("ports", [])]
            assert any(target in (p["containerPort"], p.get("name")) for p in ports), (service, target)


def test_workload_selectors_match_their_templates(objects):
    for obj in objects:
        if obj["kind"] in WORKLOADS - {"Job"}:
            assert obj["spec"]["selector"]["matchLabels"].items() <= pod_labels(obj).items()


def test_referenced_configmaps_secrets_and_service_accounts_exist(objects):
    configmaps, secrets = named(objects, "ConfigMap"), named(objects, "Secret")
    accounts = named(objects, "ServiceAccount")
    for obj in objects:
        spec = pod_spec(obj)
        if spec is None:
            continue
        if "serviceAccountName" in spec:
            assert spec["serviceAccountName"] in accounts
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets
        for container in containers_of(obj):
            for source in container.get("envFrom", []):
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in configmaps
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets
            for var in container.get("env", []):
                ref = var.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    assert ref["configMapKeyRef"]["key"] in configmaps[ref["configMapKeyRef"]["name"]]["data"]
                if "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["name"] in secrets


def test_rbac_binds_an_existing_role_to_an_existing_account(objects):
    accounts = named(objects, "ServiceAccount")
    for binding_kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        roles = named(objects, role_kind)
        for binding in named(objects, binding_kind).values():
            assert binding["roleRef"]["kind"] == role_kind and binding["roleRef"]["name"] in roles
            for subject in binding["subjects"]:
                assert subject["name"] in accounts


def grants(rules: list[Obj]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def cluster_grants_of(objects: list[Obj], account: str) -> set[tuple[str, str, str]]:
    """What the ClusterRoleBindings give a service account of the tree's namespace, cluster-wide."""
    account_namespace = named(objects, "ServiceAccount")[account]["metadata"].get("namespace", "default")
    roles = named(objects, "ClusterRole")
    granted: set[tuple[str, str, str]] = set()
    for binding in named(objects, "ClusterRoleBinding").values():
        bound = any(
            s["kind"] == "ServiceAccount" and s["name"] == account and s["namespace"] == account_namespace
            for s in binding["subjects"]
        )
        if bound and binding["roleRef"]["kind"] == "ClusterRole":
            granted |= grants(roles[binding["roleRef"]["name"]]["rules"])
    return granted


def test_executor_role_covers_the_kubernetes_backend(objects):
    granted = grants(named(objects, "Role")["gpuyard-executor"]["rules"])
    needed = {("", r, v) for r in ("pods", "services") for v in ("create", "get", "list", "watch", "delete")}
    needed |= {("", "pods/log", "get")} | {("batch", "jobs", v) for v in ("create", "get", "list", "delete")}
    assert needed <= granted


def test_the_executor_can_list_the_clusters_nodes_and_nothing_more_cluster_wide(objects):
    # nodes are cluster-scoped: a namespaced Role cannot grant them, only a ClusterRole bound to the account
    assert cluster_grants_of(objects, "gpuyard-executor") == {
        ("", "nodes", v) for v in ("get", "list", "watch")
    }


def probe_ports(container: Obj) -> Iterator[int | str]:
    for kind in ("livenessProbe", "readinessProbe", "startupProbe"):
        probe = container.get(kind, {})
        for handler in ("httpGet", "tcpSocket"):
            if handler in probe:
                yield probe[handler]["port"]


def test_probe_ports_are_container_ports(objects):
    for container in all_containers(objects):
        ports = {p["containerPort"] for p in container.get("ports", [])} | {
            p["name"] for p in container.get("ports", []) if "name" in p
        }
        for port in probe_ports(container):
            assert port in ports, f"{container['name']}: probe port {port} is not declared"


def gpuyard_containers(objects: list[Obj]) -> dict[str, Obj]:
    found = {}
    for container in all_containers(objects):
        if container.get("args", [None])[0] in SERVICES:
            found[container["args"][0]] = container
    return found


def test_each_service_runs_with_health_probes_and_resources(objects):
    found = gpuyard_containers(objects)
    assert set(found) == set(SERVICES)
    for service, container in found.items():
        health = {p["name"]: p["containerPort"] for p in container["ports"]}["health"]
        assert health == HEALTH_PORT, service
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert container["startupProbe"]["httpGet"]["port"] == "health"  # waits for NATS and the store
        resources = container["resources"]
        assert (
            resources["requests"]["cpu"] and resources["requests"]["memory"] and resources["limits"]["memory"]
        )


def test_health_port_setting_matches_the_probes(objects):
    config = named(objects, "ConfigMap")["gpuyard-config"]["data"]
    assert config["GPUYARD_HEALTH_PORT"] == str(HEALTH_PORT)
    assert config["GPUYARD_HEALTH_HOST"] == "0.0.0.0"  # probes come from the kubelet, not localhost


def test_executor_and_monitor_placement(objects):
    deployments, daemonsets = named(objects, "Deployment"), named(objects, "DaemonSet")
    executor = deployments["gpuyard-executor"]
    assert executor["spec"]["replicas"] == 1 and executor["spec"]["strategy"]["type"] == "Recreate"
    env = {e["name"]: e for e in executor["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["GPUYARD_EXECUTOR_BACKEND"]["value"] == "kubernetes"
    assert env["GPUYARD_KUBERNETES_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    monitor = daemonsets["gpuyard-monitor"]["spec"]["template"]
    assert monitor["spec"]["nodeSelector"]


def pod_environment(workload: Obj, config: dict[str, str]) -> dict[str, str]:
    """The GPUYARD_* variables of a workload's service container with a value in the manifests: the ConfigMap's,
    then its own (those from the downward API are left out: none of them says where /metrics is)."""
    container = pod_spec(workload)["containers"][0]
    env = dict(config) if any("configMapRef" in e for e in container.get("envFrom", [])) else {}
    env |= {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}
    return {k: v for k, v in env.items() if k.startswith("GPUYARD_")}


def service_of(workload: Obj) -> str | None:
    """The GPUYARD service a workload runs (its service container's first argument)."""
    return pod_spec(workload)["containers"][0].get("args", [None])[0]


def settings_from(service: str, variables: dict[str, str]) -> Any:
    """The settings of `service` as it reads them from these GPUYARD_* variables (and no others)."""
    with pytest.MonkeyPatch.context() as env:
        for name in [k for k in os.environ if k.startswith("GPUYARD_")]:
            env.delenv(name)
        for name, value in variables.items():
            env.setenv(name, value)
        return SERVICE_SETTINGS[service]()


def metrics_addresses(workload: Obj, config: dict[str, str]) -> set[tuple[str, int]]:
    """(host, port) of each /metrics the pods of a workload serve, from the settings as their service reads
    them: its own port (`service_metrics_port`), and the submit API's, the serving API's or the monitor's."""
    service = service_of(workload)
    if service not in SERVICE_SETTINGS:
        return set()
    settings = settings_from(service, pod_environment(workload, config))
    found = set()
    if settings.service_metrics_port is not None:
        found.add((settings.service_metrics_host, settings.service_metrics_port))
    on_its_port = {
        "submit": ("submit_host", "submit_port"),
        "serving": ("serving_host", "serving_port"),
        "monitor": ("metrics_host", "metrics_port"),
    }.get(service)
    if on_its_port:
        found.add((getattr(settings, on_its_port[0]), getattr(settings, on_its_port[1])))
    return found


def scrape_problems(objects: list[Obj]) -> list[str]:
    """What is wrong with the Prometheus annotations: a workload that serves /metrics and is not annotated, one
    annotated that serves none (a target always down), or with a port its pods do not expose or where its
    /metrics listens on loopback only (unreachable from Prometheus)."""
    config = named(objects, "ConfigMap")["gpuyard-config"]["data"]
    problems = []
    for workload in (w for w in objects if w["kind"] in WORKLOADS):
        name = workload["metadata"]["name"]
        annotations = workload["spec"]["template"]["metadata"].get("annotations", {})
        addresses = metrics_addresses(workload, config)
        if (annotations.get("prometheus.io/scrape") == "true") != bool(addresses):
            problems.append(f"{name}: serves /metrics on {sorted(addresses)}, annotated {annotations}")
            continue
        if not addresses:
            continue
        port = int(annotations.get("prometheus.io/port", 0))
        exposed = {p["containerPort"] for c in containers_of(workload) for p in c.get("ports", [])}
        hosts = {host for host, served in addresses if served == port}
        if port not in exposed:
            problems.append(f"{name}: annotated with port {port}, which its pods do not expose ({exposed})")
        elif not hosts & {"0.0.0.0", "::"}:
            problems.append(f"{name}: its /metrics on port {port} does not listen on every address: {hosts}")
        if annotations.get("prometheus.io/path") != METRICS_PATH:
            problems.append(f"{name}: annotated with path {annotations.get('prometheus.io/path')}")
    return problems


def test_prometheus_scrapes_each_workload_that_serves_metrics_on_a_port_it_exposes(objects):
    """Every service serves its own figures on /metrics (docs/operations.md, "Metrics of each service"), and
    each of its workloads is annotated for Prometheus's pod discovery with the port they are on."""
    assert not scrape_problems(objects)
    config = named(objects, "ConfigMap")["gpuyard-config"]["data"]
    workloads = [w for w in objects if w["kind"] in WORKLOADS]
    scraped = {w["metadata"]["name"]: metrics_addresses(w, config) for w in workloads}
    assert {name: {port for _, port in found} for name, found in scraped.items() if found} == {
        "gpuyard-submit": {8080},
        "gpuyard-scheduler": {9410},
        "gpuyard-executor": {9410},
        "gpuyard-serving": {8000},
        "gpuyard-monitor": {9400},
    }


def test_the_local_executor_alternative_is_scraped_on_its_own_port():
    [daemonset] = load_yaml_documents(KUSTOMIZE / "alternatives" / "executor-local-daemonset.yaml")
    objects = [*render(BASE), daemonset]
    objects.remove(named(objects, "Deployment")["gpuyard-executor"])
    assert not scrape_problems(objects)
    assert {port for _, port in metrics_addresses(daemonset, {})} == {9410}


def annotated(objects: list[Obj], name: str) -> Obj:
    [workload] = [o for o in objects if o["kind"] in WORKLOADS and o["metadata"]["name"] == name]
    return workload


@pytest.mark.parametrize(
    "breakage",
    ["annotated with a port it does not expose", "no port of its own", "not annotated", "on loopback"],
)
def test_a_wrong_scrape_annotation_is_found(breakage):
    objects = render(BASE)
    scheduler = annotated(objects, "gpuyard-scheduler")
    template = scheduler["spec"]["template"]
    env = template["spec"]["containers"][0]["env"]
    if breakage == "annotated with a port it does not expose":
        template["metadata"]["annotations"]["prometheus.io/port"] = "9999"
    elif breakage == "no port of its own":
        env[:] = [e for e in env if e["name"] != "GPUYARD_SERVICE_METRICS_PORT"]
    elif breakage == "not annotated":
        del template["metadata"]["annotations"]
    else:
        env[:] = [e for e in env if e["name"] != "GPUYARD_SERVICE_METRICS_HOST"]  # its default: 127.0.0.1
    [problem] = scrape_problems(objects)
    assert problem.startswith("gpuyard-scheduler: ")


# ---------------------------------------------------------------- files the pods must share

SESSION_KEY_READERS = tuple(
    s for s, model in SERVICE_SETTINGS.items() if "session_secret_file" in model.model_fields
)
"""The services that sign or accept the dashboard's sessions: those with a `session_secret_file` setting."""
METRICS_TOKEN_READERS = tuple(
    s for s, model in SERVICE_SETTINGS.items() if "metrics_token_file" in model.model_fields
)
"""The services whose /metrics asks for the scrape token: those with a `metrics_token_file` setting."""
SHARED_FILES = {
    # setting: the services that must all read it from one Secret's file
    "session_secret_file": SESSION_KEY_READERS,
    "tokens_file": SESSION_KEY_READERS,  # a session stands for a token: each reader must know the same ones
    # the submit service signs jobs' publish tokens, the executor hands them to the jobs
    "publish_secret_file": ("submit", "executor"),
    # one scrape token for every monitor and serving pod: the one Prometheus sends (else each makes its own)
    "metrics_token_file": METRICS_TOKEN_READERS,
}
DEFAULT_FILE_MODE = 0o644  # a secret volume's defaultMode when it sets none
IMAGE_USER, IMAGE_GROUP = map(
    int, re.search(r"^USER (\d+):(\d+)", (ROOT / "Dockerfile").read_text(), re.M).groups()
)


def secret_behind(workload: Obj, path: Path) -> tuple[Obj, str] | str:
    """The secret volume and the key of it whose file is `path` in the workload's service container, or what is
    wrong: not on a mounted Secret, not read-only, or a file the service's user cannot read."""
    spec = pod_spec(workload)
    container = spec["containers"][0]
    mounts = [m for m in container.get("volumeMounts", []) if path.is_relative_to(m["mountPath"])]
    if not mounts:
        return f"{path} is on no volume"
    mount = max(mounts, key=lambda m: len(m["mountPath"]))
    [volume] = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    if "secret" not in volume or "subPath" in mount:
        return f"{path} is not a file of a mounted Secret: {volume}"
    if not mount.get("readOnly"):
        return f"{path}: the Secret {volume['secret']['secretName']} is mounted writable"
    name = str(path.relative_to(mount["mountPath"]))
    items = {i["path"]: i for i in volume["secret"].get("items", [])}
    key = items[name]["key"] if name in items else name
    mode = items.get(name, {}).get("mode", volume["secret"].get("defaultMode", DEFAULT_FILE_MODE))
    if not readable_by_the_service(spec, container, mode):
        return f"{path} (mode {mode:o}) cannot be read by the service's user"
    return volume, key


def readable_by_the_service(spec: Obj, container: Obj, mode: int) -> bool:
    """Whether the container's user reads a file of a secret volume: the kubelet makes it owned by root, its
    group the pod's fsGroup (root without one), which the container's processes also belong to."""
    pod = spec.get("securityContext", {})
    context = pod | container.get("securityContext", {})
    if context.get("runAsUser", IMAGE_USER) == 0:
        return True
    groups = {context.get("runAsGroup", IMAGE_GROUP), *pod.get("supplementalGroups", [])}
    if "fsGroup" in pod:
        groups.add(pod["fsGroup"])
    return bool(mode & 0o004) or (pod.get("fsGroup", 0) in groups and bool(mode & 0o040))


def shared_file_problems(objects: list[Obj]) -> list[str]:
    """What keeps the services of SHARED_FILES from reading one file: a service whose setting is not set (each
    pod then reads or makes its own, in its own data dir), not on a Secret's file, or on another Secret or key
    than the other services', or a Secret that is not in the tree or has no such key."""
    config = named(objects, "ConfigMap")["gpuyard-config"]["data"]
    secrets = named(objects, "Secret")
    problems = []
    for setting, readers in SHARED_FILES.items():
        read: dict[str, tuple[str, str]] = {}
        for workload in (w for w in objects if w["kind"] in WORKLOADS and service_of(w) in readers):
            name = workload["metadata"]["name"]
            path = getattr(settings_from(service_of(workload), pod_environment(workload, config)), setting)
            if path is None:
                problems.append(f"{name}: {setting} is not set")
                continue
            found = secret_behind(workload, Path(path))
            if isinstance(found, str):
                problems.append(f"{name}: {setting}: {found}")
                continue
            volume, key = found
            secret = secrets.get(volume["secret"]["secretName"])
            if secret is None or key not in {**secret.get("data", {}), **secret.get("stringData", {})}:
                problems.append(f"{name}: {setting}: no Secret {volume['secret']['secretName']} with {key}")
                continue
            read[name] = (secret["metadata"]["name"], key)
        if len(set(read.values())) > 1:
            problems.append(f"{setting} is read from different Secrets: {read}")
        if {
            service_of(w) for w in objects if w["kind"] in WORKLOADS and w["metadata"]["name"] in read
        } != set(readers):
            problems.append(f"{setting}: not every one of {readers} reads it from a Secret: {sorted(read)}")
    return problems


def test_the_services_that_share_a_key_mount_the_same_secret_at_the_path_their_setting_names(objects):
    assert SESSION_KEY_READERS == ("submit", "serving")
    assert set(METRICS_TOKEN_READERS) == {"serving", "monitor", "submit"}
    assert not shared_file_problems(objects)
    config = named(objects, "ConfigMap")["gpuyard-config"]["data"]
    assert config["GPUYARD_SESSION_SECRET_FILE"] == "/etc/gpuyard/session/session.key"  # read by both


@pytest.mark.parametrize(
    "breakage",
    [
        "not mounted",
        "another Secret",
        "no such key",
        "setting not set",
        "writable",
        "unreadable",
        "no tokens",
    ],
)
def test_a_session_key_not_shared_is_found(breakage):
    objects = render(BASE)
    serving = annotated(objects, "gpuyard-serving")
    spec = serving["spec"]["template"]["spec"]
    [mount] = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "session"]
    [volume] = [v for v in spec["volumes"] if v["name"] == "session"]
    if breakage == "not mounted":
        spec["containers"][0]["volumeMounts"].remove(mount)
    elif breakage == "another Secret":
        objects.append({**named(objects, "Secret")["gpuyard-session"], "metadata": {"name": "other"}})
        volume["secret"]["secretName"] = "other"
    elif breakage == "no such key":
        volume["secret"]["items"] = [{"key": "other.key", "path": "session.key"}]
    elif breakage == "setting not set":  # each pod would make its own key in its own data dir
        del named(objects, "ConfigMap")["gpuyard-config"]["data"]["GPUYARD_SESSION_SECRET_FILE"]
    elif breakage == "writable":
        del mount["readOnly"]
    elif breakage == "unreadable":  # mode 0440, root's: only the fsGroup makes it the service's
        del spec["securityContext"]["fsGroup"]
    else:
        spec["containers"][0]["env"] = [
            e for e in spec["containers"][0]["env"] if e["name"] != "GPUYARD_TOKENS_FILE"
        ]
    problems = shared_file_problems(objects)
    assert any("gpuyard-serving" in p for p in problems), problems


def test_the_session_secret_as_shipped_turns_the_login_off_and_a_replaced_one_is_the_key(tmp_path, caplog):
    """The Secret is empty until replaced: the pods must start all the same, the dashboard's login off (the API
    and its bearer tokens work without it); with the key its comment says how to make, every pod reads it."""
    [secret] = load_yaml_documents(BASE / "session-secret.yaml")
    assert secret["metadata"]["name"] == "gpuyard-session"
    instruction = re.search(
        r'--from-literal=session\.key="\$\(openssl rand -base64 (\d+)\)"',
        (BASE / "session-secret.yaml").read_text(),
    )
    assert (
        instruction and "create secret generic gpuyard-session" in (BASE / "session-secret.yaml").read_text()
    )

    def mount(content: str) -> Path:  # as the kubelet writes a secret volume: links into ..data, mode 0440
        volume = tmp_path / f"mount-{len(content)}"
        (volume / "..data").mkdir(parents=True)
        (volume / "..data" / "session.key").write_text(content)
        (volume / "..data" / "session.key").chmod(0o440)
        (volume / "session.key").symlink_to("..data/session.key")
        return volume / "session.key"

    with caplog.at_level(logging.ERROR, logger="gpuyard.shared.auth.sessions"):
        assert (
            sessions.load_key(tmp_path, mount(secret["stringData"]["session.key"]), without_it="login off")
            is None
        )
    assert "login off" in caplog.text and "under 32 bytes" in caplog.text
    replaced = base64.b64encode(os.urandom(int(instruction.group(1)))).decode()
    assert sessions.load_key(tmp_path, mount(replaced), without_it="login off") == replaced.encode()
    assert not (tmp_path / "secrets").exists()  # no key of its own made in the data dir


def host_of(url: str) -> str:
    return re.sub(r"^\w+://", "", url).split("/")[0].split(":")[0]


def test_nats_and_store_urls_point_at_existing_services(objects):
    config = named(objects, "ConfigMap")["gpuyard-config"]["data"]
    services, statefulsets = named(objects, "Service"), named(objects, "StatefulSet")
    for url in config["GPUYARD_NATS_URL"].split(","):
        assert host_of(url) in services, url
    assert config["GPUYARD_STORE"].startswith("mongodb://")
    hosts = config["GPUYARD_STORE"].removeprefix("mongodb://").split("/")[0].split(",")
    for host in hosts:
        pod, _, service = host.split(":")[0].partition(".")
        assert statefulsets[pod.rsplit("-", 1)[0]]["spec"]["serviceName"] == service
        ordinal = int(pod.rsplit("-", 1)[1])
        assert ordinal < statefulsets[pod.rsplit("-", 1)[0]]["spec"]["replicas"]
    assert "replicaSet=rs0" in config["GPUYARD_STORE"]


def test_nats_cluster_routes_and_jetstream(objects):
    nats = named(objects, "StatefulSet")["nats"]
    assert nats["spec"]["replicas"] == 3
    assert services_named(objects, nats["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    assert nats["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    conf = named(objects, "ConfigMap")["nats-config"]["data"]["nats.conf"]
    routes = re.findall(r"nats://(nats-\d)\.([\w-]+):6222", conf)
    assert sorted(r[0] for r in routes) == ["nats-0", "nats-1", "nats-2"]
    assert {r[1] for r in routes} == {nats["spec"]["serviceName"]}
    assert "jetstream" in conf and "store_dir: /data" in conf


def test_mongo_replica_set_and_idempotent_initiation(objects):
    mongo = named(objects, "StatefulSet")["mongo"]
    assert mongo["spec"]["replicas"] == 3
    assert mongo["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["--replSet", "rs0"]
    script = " ".join(
        named(objects, "Job")["mongo-init-replicaset"]["spec"]["template"]["spec"]["containers"][0]["command"]
    )
    members = re.findall(r'host: "(mongo-\d)\.mongo:27017"', script)
    assert members == ["mongo-0", "mongo-1", "mongo-2"]
    assert "rs.status()" in script and "NotYetInitialized" in script  # initiate only when not yet initiated


def services_named(objects: list[Obj], name: str) -> Obj:
    return named(objects, "Service")[name]


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) is not installed"
)
@pytest.mark.parametrize("directory", [BASE, *OVERLAYS], ids=lambda p: p.name)
def test_the_tiny_renderer_agrees_with_kustomize(directory):
    result = subprocess.run(
        ["kubectl", "kustomize", str(directory)], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    expected = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(result.stdout) if o}
    mine = {(o["kind"], o["metadata"]["name"]): o for o in render(directory)}
    assert mine.keys() == expected.keys()
    for key, obj in mine.items():
        assert json.dumps(obj, sort_keys=True) == json.dumps(expected[key], sort_keys=True), key


# ---------------------------------------------------------------- docker compose, Dockerfile


COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_services_and_dependencies():
    services = COMPOSE["services"]
    assert set(SERVICES) | {"nats", "mongo"} <= set(services)
    for name, service in services.items():
        assert "healthcheck" in service, name
        for target, condition in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on unknown {target}"
            assert condition == {"condition": "service_healthy"}
            assert "healthcheck" in services[target]
    for name in SERVICES:
        assert services[name]["command"] == [name]
        assert {"nats", "mongo"} <= set(services[name]["depends_on"])
        assert services[name]["environment"]["GPUYARD_HEALTH_PORT"] == str(HEALTH_PORT)
        assert f":{HEALTH_PORT}/healthz" in " ".join(services[name]["healthcheck"]["test"])


def test_compose_infrastructure():
    services = COMPOSE["services"]
    assert "-js" in services["nats"]["command"]
    assert any(volume.endswith(":/data") for volume in services["nats"]["volumes"])
    assert services["mongo"]["command"][:2] == ["--replSet", "rs0"]
    assert "rs.initiate" in " ".join(services["mongo"]["healthcheck"]["test"])
    env = services["submit"]["environment"]
    assert host_of(env["GPUYARD_NATS_URL"]) == "nats" and host_of(env["GPUYARD_STORE"]) == "mongo"
    for volume in ("nats-data", "mongo-data"):
        assert volume in COMPOSE["volumes"]


def test_compose_submit_and_serving_share_the_session_key_and_the_tokens():
    """Their containers' data dirs are their own unless a volume joins them: the key of the dashboard's sessions
    (made by the first to start where the setting or the data dir says) must be on one volume both mount."""
    dockerfile = (ROOT / "Dockerfile").read_text()
    image_env = dict(re.findall(r"\b(GPUYARD_\w+)=(\S+)", dockerfile))
    where, tokens = {}, {}
    for service in SESSION_KEY_READERS:
        variables = image_env | {k: str(v) for k, v in COMPOSE["services"][service]["environment"].items()}
        settings = settings_from(service, variables)
        key = settings.session_secret_file or settings.data_dir / SECRETS_DIR / sessions.SECRET_FILE
        mounts = [v.split(":") for v in COMPOSE["services"][service].get("volumes", [])]
        on = [(source, target) for source, target, *_ in mounts if key.is_relative_to(target)]
        assert on, f"{service}: {key} is on no volume: each container would make its own key"
        source, target = max(on, key=lambda m: len(m[1]))
        assert source in COMPOSE["volumes"], f"{service}: {source} is not a named volume"
        # a new named volume takes its owner from the image's folder: the data dir is the service user's home
        assert re.search(rf"--home-dir {re.escape(target)} --create-home", dockerfile), target
        where[service] = (source, key.relative_to(target))
        tokens[service] = (settings.tokens, settings.tokens_file)
    assert len(set(where.values())) == 1, where
    assert len(set(tokens.values())) == 1 and any(next(iter(tokens.values()))), tokens


def test_compose_gives_the_executor_the_gpus():
    (device,) = COMPOSE["services"]["executor"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]


def test_compose_builds_from_a_dockerfile():
    for name in SERVICES:
        build = COMPOSE["services"][name]["build"]
        context = ROOT / (build if isinstance(build, str) else build["context"])
        assert (context / "Dockerfile").is_file()


def dockerignore_excludes(path: str) -> bool:
    """Whether .dockerignore keeps `path` out of the build context (last matching rule wins)."""
    excluded = False
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        rule = raw.strip()
        if not rule or rule.startswith("#"):
            continue
        negate, pattern = rule.startswith("!"), rule.lstrip("!").rstrip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        if re.fullmatch(regex + "(/.*)?", path):
            excluded = not negate
    return excluded


def test_dockerfile_copies_exist_and_are_in_the_context():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", dockerfile, re.M)
    assert re.search(r"^USER 10001", dockerfile, re.M)  # not root
    sources = [
        source
        for line in re.findall(r"^COPY (.+)$", dockerfile, re.M)
        if "--from=" not in line  # (a file of an earlier stage)
        for source in [w for w in line.split() if not w.startswith("--")][:-1]
    ]
    assert "services" in sources and "shared" in sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not dockerignore_excludes(source), f".dockerignore excludes {source}"
    assert dockerignore_excludes(".venv") and dockerignore_excludes("tests/unit/project/test_deploy.py")


def test_entrypoint_runs_the_named_service():
    script = (ROOT / "deploy" / "docker" / "entrypoint.sh").read_text()
    for name in SERVICES:
        assert name in script
    assert 'exec python -P -m "gpuyard.services.$service"' in script
    for name in SERVICES:
        assert (ROOT / "services" / name).is_dir()


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker client installed")
def test_docker_compose_config_accepts_the_file():
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        pytest.skip("the docker client has no compose plugin (docker compose version failed)")
    result = subprocess.run(
        ["docker", "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_kubernetes_backend_settings_in_the_configmap_parse(monkeypatch):
    data = named(render(BASE), "ConfigMap")["gpuyard-config"]["data"]
    backend = {k: v for k, v in data.items() if k.startswith("GPUYARD_KUBERNETES_")}
    assert backend
    for key, value in backend.items():
        monkeypatch.setenv(key, value)
    config = ExecutorSettings().kubernetes  # read from GPUYARD_KUBERNETES_*, as the executor does
    assert config.image == data["GPUYARD_KUBERNETES_IMAGE"]
    assert config.tolerations[0]["key"] == "nvidia.com/gpu"


# ---------------------------------------------------------------- settings the files set


def gpuyard_variables_set() -> dict[str, set[str]]:
    """Every GPUYARD_* variable the deployment files set, with where."""
    found: dict[str, set[str]] = {}

    def add(name: str, where: str) -> None:
        if name.startswith("GPUYARD_"):
            found.setdefault(name, set()).add(where)

    kubernetes = [(name, objs) for name, objs in TREES]
    kubernetes += [(p.name, load_yaml_documents(p)) for p in ALTERNATIVES]
    for where, objs in kubernetes:
        for obj in objs:
            for key in obj.get("data", {}) if obj["kind"] == "ConfigMap" else ():
                add(key, where)
            for container in containers_of(obj):
                for variable in container.get("env", []):
                    add(variable["name"], where)
    for name, service in COMPOSE["services"].items():
        for key in service.get("environment") or {}:
            add(key, f"docker-compose.yml {name}")
    for key in re.findall(r"\b(GPUYARD_\w+)=", (ROOT / "Dockerfile").read_text()):
        add(key, "Dockerfile")
    return found


def test_every_gpuyard_variable_the_files_set_is_a_setting():
    known = {
        env_name(name, table.nested_in)
        for table in TABLES
        for name in table.model.model_fields
        if name not in table.skip
    }
    found = gpuyard_variables_set()
    assert {"GPUYARD_NATS_URL", "GPUYARD_KUBERNETES_IMAGE"} <= set(found)
    unknown = {name: sorted(where) for name, where in found.items() if name not in known}
    assert not unknown, f"not a setting of any model in shared/settings/: {unknown}"


def test_serving_and_metrics_ports_are_the_settings():
    serving_port = ServingSettings.model_fields["serving_port"].default
    metrics_port = MonitorSettings.model_fields["metrics_port"].default
    assert (serving_port, metrics_port) == (8000, 9400)
    objects = render(BASE)
    serving = named(objects, "Deployment")["gpuyard-serving"]
    assert {"name": "http", "containerPort": serving_port} in containers_of(serving)[0]["ports"]
    assert named(objects, "Service")["gpuyard-serving"]["spec"]["ports"][0]["port"] == serving_port
    monitor = named(objects, "DaemonSet")["gpuyard-monitor"]
    assert metrics_port in {p["containerPort"] for p in containers_of(monitor)[0]["ports"]}
    services = COMPOSE["services"]
    assert f"{serving_port}:{serving_port}" in services["serving"]["ports"]
    assert f"{metrics_port}:{metrics_port}" in services["monitor"]["ports"]
    exposed = re.search(r"^EXPOSE (.+)$", (ROOT / "Dockerfile").read_text(), re.M).group(1).split()
    assert {str(serving_port), str(metrics_port)} <= set(exposed)
