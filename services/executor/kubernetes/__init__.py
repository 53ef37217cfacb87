"""The executor's Kubernetes backend: each replica of a placed job runs as a pod.

Entry points: `KubernetesController` (launch, cancel, poll, logs) over a `KubeApi` (`ClientKubeApi` for a
real cluster), configured by `KubernetesConfig`; `build_job_manifests` renders the objects without a cluster.
"""

from gpuyard.services.executor.classify import classify_log_tail
from gpuyard.services.executor.kubernetes.api import KubeAlreadyExists, KubeApi, KubeApiError, KubeNotFound
from gpuyard.services.executor.kubernetes.config import FractionalGpuMode, KubernetesConfig, OwnerTarget
from gpuyard.services.executor.kubernetes.controller import KubernetesController, LaunchResult
from gpuyard.services.executor.kubernetes.manifests import JobManifests, build_job_manifests
from gpuyard.services.executor.kubernetes.outcomes import ReplicaOutcome, ReplicaPhase, pod_outcome

__all__ = [
    "FractionalGpuMode",
    "JobManifests",
    "KubeAlreadyExists",
    "KubeApi",
    "KubeApiError",
    "KubeNotFound",
    "KubernetesConfig",
    "KubernetesController",
    "LaunchResult",
    "OwnerTarget",
    "ReplicaOutcome",
    "ReplicaPhase",
    "build_job_manifests",
    "classify_log_tail",
    "pod_outcome",
]
