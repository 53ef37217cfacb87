"""The gateway started beside the executor that announces its node (`main.py`): the replicas of its backend,
the settings of `gpuyard.shared.settings.gateway`."""

from __future__ import annotations

from gpuyard.services.executor.executor import Executor
from gpuyard.services.executor.gateway.access import LocalAccess, ReplicaAccess
from gpuyard.services.executor.gateway.server import Gateway
from gpuyard.services.executor.nodelog import node_log
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.settings.gateway import gateway_settings_of


def access_of(settings: ExecutorSettings, executor: Executor) -> ReplicaAccess:
    if settings.executor_backend == "kubernetes":
        from gpuyard.services.executor.gateway.kubeaccess import KubeAccess

        return KubeAccess(executor.backend)
    return LocalAccess(settings.data_dir, settings.node_name)


def start_gateway(service: Service, settings: ExecutorSettings, executor: Executor) -> str:
    """Serve the gateway (a task of `service`); its URL, or "" where it cannot listen (said once: the node's
    jobs run, and cannot be reached, until the executor's next start)."""
    gateway_settings = gateway_settings_of(settings)
    try:
        gateway = Gateway(gateway_settings, access_of(settings, executor), address=executor.nodes.address)
    except OSError as exc:
        where = f"{gateway_settings.gateway_host}:{gateway_settings.gateway_port}"
        node_log.error(
            "the executor gateway cannot listen on %s (%s): this node's jobs cannot be reached", where, exc
        )
        return ""
    service.spawn(gateway.serve(), "gateway")
    return gateway.url
