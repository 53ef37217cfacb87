"""Wiring of the executor (`executor.py`): the bus subscriptions and background loops of one executor process.

- worker 0 of the node announces it (`announce.py`: one heartbeat per node, whatever the number of its
  executor processes); every worker learns the other nodes' addresses from their heartbeats;
- worker 0 also deletes the directories of jobs finished longer ago than the retention, their checkpoint and
  output folders included (`retention.py`);
- the GPU slice guard runs where GPU memory can be read (`gpuguard.py`);
- the backend's own watch runs beside (the local backend's reaper: if it ends, the executor stops, and its
  next start adopts what runs);
- worker 0 also serves the node's gateway, the submit service's way into running replicas (exec, shell,
  ports: `gateway/`), its URL in the node's heartbeat;
- after reconciling what an earlier executor left (`Executor.reconcile`), placements come from a durable
  consumer the node's executor processes share, and the control events (cancel, preemption, the attempt's
  end, the monitor's idle warning and stop) from a durable consumer of each.
"""

from __future__ import annotations

import os
import signal

from gpuyard.services.executor import jobenv
from gpuyard.services.executor.backends import working_root
from gpuyard.services.executor.executor import Executor
from gpuyard.services.executor.gateway.wiring import start_gateway
from gpuyard.services.executor.local import LocalBackend
from gpuyard.services.executor.nodelog import said_by
from gpuyard.services.executor.retention import JobDirSweeper
from gpuyard.shared.contracts.events.nodes import EnvironmentRemoveRequested, NodeHeartbeat
from gpuyard.shared.contracts.events.subjects import HOLDER_EXECUTOR
from gpuyard.shared.runtime.service import Service
from gpuyard.shared.runtime.storageroot import storage_root_of
from gpuyard.shared.settings.executor import ExecutorSettings

JOB_UMASK = 0o022
"""Jobs inherit the executor's umask, through its reaper (whose child sets none): they get the usual one, while
the executor creates its own files with explicit private modes (pid files, logs, stores: `gpuyard.shared.runtime.paths`)."""


async def main(service: Service, settings: ExecutorSettings) -> None:
    os.umask(JOB_UMASK)
    said_by(settings.executor_worker)
    jobenv.configure_publishing(jobenv.publishing_from_settings(settings))
    bus = service.bus
    executor = Executor(service, settings)
    await executor.start()
    service.spawn(executor.backend.run(), "backend")
    if executor.worker == 0:
        executor.nodes.gateway = start_gateway(service, settings, executor)
        service.spawn(executor.nodes.run(), "heartbeat")
        sweeper = JobDirSweeper(
            settings.data_dir,
            executor.store,
            executor.attempts,
            settings.retention,
            working_root(settings),
            storage_root=storage_root_of(settings) if settings.executor_backend != "kubernetes" else None,
            registry=service.metrics,
            environments=local.environments if (local := local_backend(executor)) is not None else None,
        )
        service.spawn(sweeper.run(settings.retention_interval), "retention")
        if local is not None:  # (an admin's `gpuyard envs rm`: worker 0 of the node acts on it)
            await bus.subscribe_to(EnvironmentRemoveRequested, local.on_environment_remove)
    await bus.subscribe_to(NodeHeartbeat, executor.nodes.on_heartbeat)
    if executor.gpu_guard.reader is not None:
        service.spawn(executor.gpu_guard.run(), "gpu-memory-watch")
    try:
        await executor.reconcile()
        durable = f"executor-{settings.node_name}".replace(".", "-")
        await executor.consume(
            bus,
            shared=durable,
            own=f"{durable}-{executor.worker}",
            holder=HOLDER_EXECUTOR,
            max_deliver=settings.max_deliver,
            concurrency=settings.event_concurrency,
        )
        await executor.reconcile()  # placed before the consumers existed (a new JetStream store: a restore)
        await service.stopping.wait()
    finally:
        # Ctrl-C (and `gpuyard up`'s own stop) stops the node's jobs; SIGTERM (a service manager's restart, an
        # upgrade) or a lost supervisor leaves them running for the next executor to adopt
        await executor.shutdown(stop_jobs=service.stop_signal == signal.SIGINT)


def local_backend(executor: Executor) -> LocalBackend | None:
    """The executor's local backend (its node's job environments), None for the Kubernetes backend."""
    return executor.backend if isinstance(executor.backend, LocalBackend) else None
