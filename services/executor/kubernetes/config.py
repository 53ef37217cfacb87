"""The Kubernetes backend's settings, under the names the backend's modules import them by. They are defined
in shared/settings/kubernetes.py, beside the other settings, since `ExecutorSettings.kubernetes` holds them."""

from gpuyard.shared.settings.kubernetes import FractionalGpuMode, KubernetesConfig, OwnerTarget

__all__ = ["FractionalGpuMode", "KubernetesConfig", "OwnerTarget"]
