"""The Kubernetes backend's settings, under the names the backend's modules import them by. They are defined
in shared/kubernetes_settings.py, beside the other settings, since `ExecutorSettings.kubernetes` holds them."""

from gpuyard.shared.kubernetes_settings import FractionalGpuMode, KubernetesConfig, OwnerTarget

__all__ = ["FractionalGpuMode", "KubernetesConfig", "OwnerTarget"]
