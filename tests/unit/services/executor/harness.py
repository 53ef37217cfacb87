"""The real `Executor` over a real embedded event store, without NATS: events it records are stored (the
ledger has no bus), events it publishes (alerts) are kept in `bus.published`, and the test delivers job
events to it by calling its `handlers` as the bus consumer would."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuyard.services.executor.executor import Executor
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData, make_event
from gpuyard.shared.contracts.events.jobs import GpuShare, JobPlaced, JobSubmitted, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec
from gpuyard.shared.contracts.jobstate import JobView
from gpuyard.shared.settings.executor import ExecutorSettings
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.logs import open_log_store


class FakeBus:
    def __init__(self) -> None:
        self.published: list[CloudEvent] = []

    async def publish(self, event: CloudEvent, *, tenant: str | None = None) -> None:
        self.published.append(event)

    def of_kind(self, kind: str) -> list[Any]:
        return [e.data for e in self.published if getattr(e.data, "kind", None) == kind]


class FakeService:
    def __init__(self, store, ledger: JobLedger, bus: FakeBus, logs=None):
        self.store, self.ledger, self.bus, self.logs = store, ledger, bus, logs
        self.needs_logs = logs is not None  # (without a log store: the executor ships nothing)
        self.source = "/test/executor"


class Harness:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.data_dir = tmp_path / "data"
        self.store = None
        self.logs = None
        self.ledger: JobLedger | None = None
        self.bus = FakeBus()
        self.executors: list[Executor] = []

    async def open(self) -> Harness:
        self.store = await open_store(f"sqlite:///{self.tmp_path / 'events.db'}")
        self.ledger = JobLedger(self.store, None, "/test")
        self.logs = await open_log_store(f"sqlite:///{self.tmp_path / 'logs.db'}")
        return self

    def settings(self, **overrides: Any) -> ExecutorSettings:
        values = {
            "node_name": "node-a",
            "simulate_gpus": 2,
            "data_dir": self.data_dir,
            "grace_seconds": 1.0,
            "retry_backoff": 0.05,
            "cgroup_root": self.tmp_path / "no-cgroup-here",
            "advertise_address": "127.0.0.1",
            "job_users": "*=platform",  # (jobs write to the test's folders; tests of job users set their own)
            **overrides,
        }
        return ExecutorSettings(**values)

    async def executor(self, backend=None, gpu_reader=None, **settings: Any) -> Executor:
        service = FakeService(self.store, self.ledger, self.bus, self.logs)
        executor = Executor(service, self.settings(**settings), backend=backend, gpu_reader=gpu_reader)
        await executor.start()
        self.executors.append(executor)
        return executor

    async def close(self) -> None:
        for executor in self.executors:
            await executor.shutdown()
        await self.store.close()
        await self.logs.close()

    # ------------------------------------------------------------------ jobs

    async def submit(self, tenant: str = "team", **spec: Any) -> str:
        job_id = uuid.uuid4().hex
        job = JobSpec.model_validate({"name": "unit", **spec})
        await self.ledger.append(
            job_id, JobSubmitted(job_id=job_id, name=job.name, tenant=tenant, user="ana", spec=job)
        )
        return job_id

    async def place(
        self,
        executor: Executor,
        job_id: str,
        attempt: int = 1,
        nodes: list[str] | None = None,
        gpus: list[list[GpuShare]] | None = None,
    ) -> JobPlaced:
        view = await self.ledger.load(job_id)
        replicas = view.spec.replicas
        nodes = nodes or ["node-a"] * replicas
        placements = [
            ReplicaPlacement(
                replica=r,
                node=nodes[r],
                gpus=gpus[r] if gpus else [],
                cpus=view.spec.resources.cpus,
                memory_bytes=view.spec.resources.memory,
            )
            for r in range(replicas)
        ]
        placed = JobPlaced(job_id=job_id, attempt=attempt, placements=placements)
        await self.ledger.append(job_id, placed)
        await self.deliver(executor, placed)
        return placed

    async def record(self, executor: Executor, data: EventData) -> None:
        """Store an event (as another service would) and deliver it to the executor."""
        await self.ledger.append(data.job_id, data)
        await self.deliver(executor, data)

    async def deliver(self, executor: Executor, data: EventData) -> None:
        """Deliver the stored event that holds `data`, as the bus would (or, when none does, a new event the
        store does not hold, as a forger would)."""
        stored = [e for e in await self.ledger.events(data.job_id) if e.data == data]
        event = stored[-1] if stored else make_event(data, source="/test")
        await executor.handlers(event)

    async def view(self, job_id: str) -> JobView:
        return await self.ledger.load(job_id)

    async def types(self, job_id: str) -> list[str]:
        return [e.type.removeprefix("io.gpuyard.job.") for e in await self.ledger.events(job_id)]

    async def wait(self, job_id: str, *states: str, within: float = 15) -> JobView:
        deadline = time.monotonic() + within
        while True:
            view = await self.view(job_id)
            if view.state.value in states:
                return view
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"job {job_id} is {view.state.value}, not {states}: {await self.types(job_id)}"
                )
            await asyncio.sleep(0.05)

    async def wait_for(self, check, within: float = 15, what: str | Callable[[], str] = "condition"):
        deadline = time.monotonic() + within
        while True:
            value = await check() if asyncio.iscoroutinefunction(check) else check()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what() if callable(what) else what}")
            await asyncio.sleep(0.05)
