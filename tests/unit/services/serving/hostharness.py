"""A serving `Host` over a real embedded event store and model store, without NATS: the job events it records
are stored (the ledger has no bus), the model events it publishes are kept in `bus.published`, and the test
delivers job events to it by calling its `handlers` as the bus consumers would (see tests/unit/services/executor/harness.py
for the executor's)."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from gpuyard.services.serving.held import HeldSessions
from gpuyard.services.serving.host import Host
from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.runtime import load_onnx
from gpuyard.shared.contracts.events.envelope import CloudEvent, EventData, make_event
from gpuyard.shared.contracts.events.jobs import GpuShare, JobPlaced, JobSubmitted, ReplicaPlacement
from gpuyard.shared.contracts.jobspec import JobSpec, ServeSpec
from gpuyard.shared.contracts.jobstate import JobView
from gpuyard.shared.modelfiles.store import ModelStore
from gpuyard.shared.stores.events import open_store
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry as ModelCatalog

NODE = "node-a"
ENDPOINT = "http://node-a:8000"


class FakeBus:
    def __init__(self) -> None:
        self.published: list[CloudEvent] = []

    async def publish(self, event: CloudEvent, *, tenant: str | None = None, version=None) -> None:
        self.published.append(event)

    def of(self, cls) -> list[Any]:
        return [e.data for e in self.published if isinstance(e.data, cls)]


class FakeService:
    def __init__(self, store, ledger: JobLedger, bus: FakeBus):
        self.store, self.ledger, self.bus = store, ledger, bus
        self.source = "/test/serving"


class CountingLoader:
    """load_onnx, counting its calls; `delay` makes each load take that long (a large model)."""

    def __init__(self, delay: float = 0.0):
        self.calls: list[dict] = []
        self.delay = delay

    def __call__(self, artifact, **kwargs):
        self.calls.append({"artifact": artifact, **kwargs})
        if self.delay:
            time.sleep(self.delay)
        return load_onnx(artifact, **kwargs)


class HostHarness:
    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.bus = FakeBus()
        self.hosts: list[Host] = []

    async def open(self) -> HostHarness:
        self.store = await open_store(f"sqlite:///{self.tmp_path / 'events.db'}")
        self.ledger = JobLedger(self.store, None, "/test")
        self.files = ModelStore(str(self.tmp_path / "models"))
        self.catalog = ModelCatalog(self.store, None, "/test", self.files)
        return self

    def host(self, loader=None) -> Host:
        """A serving service's host of node-a (a new one: a restart)."""
        self.registry = ModelRegistry()
        self.loader = loader or CountingLoader()
        host = Host(
            FakeService(self.store, JobLedger(self.store, None, "/test/serving"), self.bus),
            node=NODE,
            endpoint=ENDPOINT,
            sessions=HeldSessions(self.registry),
            catalog=self.catalog,
            cache_dir=self.tmp_path / "cache",
            retry_backoff=0.05,
            loader=self.loader,
        )
        self.hosts.append(host)
        return host

    async def close(self) -> None:
        for host in self.hosts:
            await host.close()
        await self.store.close()

    async def publish(self, data: bytes, name: str = "mnist", tenant: str = "vision") -> int:
        return (await self.catalog.publish(tenant=tenant, name=name, data=data)).version.version

    async def submit(self, name: str = "mnist", version: int = 1, tenant: str = "vision", **serve) -> str:
        job_id = uuid.uuid4().hex[:16]
        spec = JobSpec(serve=ServeSpec(model=name, version=version, **serve), resources={"gpus": 0.25})
        await self.ledger.append(
            job_id,
            JobSubmitted(job_id=job_id, name=spec.serve.job_name, tenant=tenant, user="ana", spec=spec),
        )
        return job_id

    async def place(self, host: Host, job_id: str, node: str = NODE, gpu: int = 1) -> JobPlaced:
        view = await self.ledger.load(job_id)
        placed = JobPlaced(
            job_id=job_id,
            attempt=view.attempt,
            placements=[ReplicaPlacement(replica=0, node=node, gpus=[GpuShare(index=gpu, fraction=0.25)])],
        )
        await self.ledger.append(job_id, placed)
        await self.deliver(host, placed)
        return placed

    async def record(self, host: Host, data: EventData) -> None:
        """Store an event (as another service would) and deliver it to the host."""
        await self.ledger.append(data.job_id, data)
        await self.deliver(host, data)

    async def deliver(self, host: Host, data: EventData) -> None:
        stored = [e for e in await self.ledger.events(data.job_id) if e.data == data]
        event = stored[-1] if stored else make_event(data, source="/test")
        await host.handlers(event)

    async def view(self, job_id: str) -> JobView:
        return await self.ledger.load(job_id)

    async def types(self, job_id: str) -> list[str]:
        return [e.type.removeprefix("io.gpuyard.job.") for e in await self.ledger.events(job_id)]

    async def until(self, check, within: float = 10) -> None:
        deadline = time.monotonic() + within
        while not check():
            if time.monotonic() > deadline:
                raise AssertionError("timed out")
            await asyncio.sleep(0.01)

    async def wait(self, job_id: str, *states: str, within: float = 10) -> JobView:
        deadline = time.monotonic() + within
        while True:
            view = await self.view(job_id)
            if view.state.value in states:
                return view
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} is {view.state.value}: {await self.types(job_id)}")
            await asyncio.sleep(0.02)
