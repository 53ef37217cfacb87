"""The backend the settings choose, built: local process groups, Kubernetes pods or Slurm batch jobs; and where its
jobs have folders of their own besides the data dir's, which the retention deletes with theirs (`working_root`)."""

from __future__ import annotations

from pathlib import Path

from gpuyard.services.executor.backend import Backend
from gpuyard.services.executor.cgroups import Cgroups
from gpuyard.services.executor.jobenv import mps_running
from gpuyard.services.executor.local import LocalBackend
from gpuyard.services.executor.logfile import LogBudget
from gpuyard.services.executor.outputpublish import OutputPublisher
from gpuyard.services.executor.slurm.batch import spool_folder
from gpuyard.shared.runtime.jobusers import JobUsers
from gpuyard.shared.runtime.outputstore import OutputStore
from gpuyard.shared.runtime.storageroot import storage_root_of
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.stores.events import EventStore
from gpuyard.shared.stores.logs.shipper import LogShipper
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeRegistry


def make_backend(
    settings: ExecutorSettings,
    *,
    simulated: bool,
    gpu_memory: dict[int, int],
    shipper: LogShipper | None = None,
    store: EventStore | None = None,
) -> Backend:
    """`store`: the executor's event store, where the Kubernetes backend finds the volumes its jobs mount."""
    if settings.executor_backend == "kubernetes":
        return kubernetes_backend(settings, shipper, store)
    if settings.executor_backend == "slurm":
        return slurm_backend(settings, shipper)
    mps = settings.mps == "on" or (settings.mps == "auto" and not simulated and mps_running())
    return LocalBackend(
        node=settings.node_name,
        data_dir=settings.data_dir,
        cgroups=Cgroups(settings.cgroup_root, settings.cgroup_parent or None, enabled=settings.cgroup_limits),
        log_max_bytes=settings.log_max_bytes,
        log_backups=settings.log_backups,
        simulated=simulated,
        gpu_memory=gpu_memory,
        mps=mps,
        shipper=shipper,
        job_users=JobUsers.from_setting(settings.job_users, settings.job_uid_base),
        job_root=settings.job_root,
        storage_root=storage_root_of(settings),
        start_helper=settings.replica_start == "helper",
        log_budget=LogBudget.share(settings.tenant_log_budget, settings.executor_workers),
        volume_store=settings.volume_store,
        output_store=settings.output_store,
        environments=settings,
    )


def kubernetes_backend(
    settings: ExecutorSettings, shipper: LogShipper | None, store: EventStore | None
) -> Backend:
    from gpuyard.services.executor.kubernetes.backend import KubernetesBackend
    from gpuyard.services.executor.kubernetes.controller import KubernetesController
    from gpuyard.services.executor.kubernetes.volumecopy import VolumeCopy

    try:
        from gpuyard.services.executor.kubernetes.client_api import ClientKubeApi

        api = ClientKubeApi.from_environment(settings.kubeconfig or None)
    except Exception as exc:
        raise RuntimeError(
            "the kubernetes backend needs in-cluster credentials (a service account) or a kubeconfig "
            f"(GPUYARD_KUBECONFIG): {exc}"
        ) from exc
    return KubernetesBackend(
        KubernetesController(api, settings.kubernetes),
        data_dir=settings.data_dir,
        poll_interval=settings.kubernetes.poll_interval,
        log_interval=settings.kubernetes.log_interval,
        log_max_bytes=settings.log_max_bytes,
        log_backups=settings.log_backups,
        shipper=shipper,
        # (one executor process mirrors the pods' logs: the node's whole budget is its own)
        log_budget=LogBudget.share(settings.tenant_log_budget, 1),
        volumes=VolumeRegistry(store, None, f"/gpuyard/executor/{settings.instance}").get
        if store is not None
        else None,
        volume_copy=VolumeCopy(
            settings.volume_store, settings.kubernetes.platform_image, settings.kubernetes.volume_store_secret
        )
        if settings.volume_store
        else None,
        # (pods write outputs to the NFS export, mounted at this executor's storage root; any user's files)
        outputs=OutputPublisher(
            OutputStore(settings.output_store), storage_root_of(settings), lambda _t: None
        )
        if settings.output_store
        else None,
    )


def slurm_backend(settings: ExecutorSettings, shipper: LogShipper | None) -> Backend:
    from gpuyard.services.executor.slurm.backend import SlurmBackend

    return SlurmBackend(
        settings.slurm,
        data_dir=settings.data_dir,
        job_users=JobUsers.from_setting(settings.job_users, settings.job_uid_base),
        grace=settings.grace_seconds,
        log_max_bytes=settings.log_max_bytes,
        log_backups=settings.log_backups,
        shipper=shipper,
        log_budget=LogBudget.share(settings.tenant_log_budget, 1),
        storage_root=storage_root_of(settings),
        volume_store=settings.volume_store,
        output_store=settings.output_store,
    )


def working_root(settings: ExecutorSettings) -> Path | None:
    """Where this backend's jobs have folders of their own by job id besides the data dir's `jobs/` (the
    working directories of jobs run as other users; on Slurm, the spool folder), which the retention deletes
    with the job's: None when there is no such place."""
    if settings.executor_backend == "slurm":
        return spool_folder(settings.slurm, settings.data_dir)
    return settings.job_root
