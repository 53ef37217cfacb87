"""The sessions this serving service holds, one per serve job placed on its node, and which of them the model
registry serves.

The registry (`registry.py`) serves one session per model version; two replicas of one version placed on the
same node (two serve jobs) are two sessions held here, and the registry serves one of them: when that one is
released, the other takes its place, so the version keeps answering. A version whose last session is released
leaves the registry once the requests it has queued are answered.

Models are kept in the registry under their qualified name (`model_key`, `OWNER/NAME`: two tenants may each
have a model called `mnist`); a caller names its own models by their name alone and another tenant's by this
qualified name (`access.py`)."""

from __future__ import annotations

from dataclasses import dataclass

from gpuyard.services.serving.registry import ModelRegistry
from gpuyard.services.serving.runtime import OnnxModel
from gpuyard.shared.contracts.stops import StopReason
from gpuyard.shared.stores.readmodels.modelregistry import qualified_name


def model_key(tenant: str, name: str) -> str:
    """The registry's key of tenant `tenant`'s model `name`: its qualified name."""
    return qualified_name(tenant, name)


def split_key(key: str) -> tuple[str, str]:
    tenant, _, name = key.partition("/")
    return tenant, name


@dataclass(eq=False)
class Held:
    """One serve job's replica on this node, from the moment it is taken on until it is released."""

    job_id: str
    attempt: int
    tenant: str
    """The model's tenant (who owns it), not necessarily the job's."""
    name: str
    version: int
    replica: int = 0
    gpu: int | None = None
    model: OnnxModel | None = None
    """None while it loads."""
    stop: StopReason | None = None
    """Why it is being stopped while it loads (cancelled, preempted, ended): the loader settles it."""

    @property
    def key(self) -> str:
        return model_key(self.tenant, self.name)


class HeldSessions:
    def __init__(self, registry: ModelRegistry, *, max_batch_size: int = 0, max_queue_delay_us: int = 0):
        self.registry = registry
        self.max_batch_size = max_batch_size
        self.max_queue_delay_us = max_queue_delay_us
        self.by_job: dict[str, Held] = {}
        self._served: dict[tuple[str, int], Held] = {}
        """The session the registry serves for each (model key, version)."""

    def holds_job(self, job_id: str) -> bool:
        return job_id in self.by_job

    def get(self, job_id: str) -> Held | None:
        return self.by_job.get(job_id)

    def begin(self, held: Held) -> bool:
        """Take `held` on (it loads); False when its job is already held here."""
        if held.job_id in self.by_job:
            return False
        self.by_job[held.job_id] = held
        return True

    def serve(self, held: Held, model: OnnxModel) -> None:
        """`held` has loaded: the registry serves it unless another session of its version already answers."""
        held.model = model
        if (held.key, held.version) not in self._served:
            self._put(held, model)

    def _put(self, held: Held, model: OnnxModel) -> None:
        self._served[(held.key, held.version)] = held
        self.registry.add(
            held.key,
            held.version,
            model,
            max_batch_size=self.max_batch_size,
            max_queue_delay_us=self.max_queue_delay_us,
        )

    async def release(self, held: Held) -> None:
        """Stop holding `held`: another session of its version takes its place in the registry, or the version
        leaves it once the requests it has queued are answered (a request in flight is never failed)."""
        if self.by_job.get(held.job_id) is held:
            del self.by_job[held.job_id]
        slot = (held.key, held.version)
        if self._served.get(slot) is not held:
            return
        del self._served[slot]
        for other in self.by_job.values():
            if (other.key, other.version) == slot and other.model is not None:
                self._put(
                    other, other.model
                )  # (the registry closes the old batcher: what it queued still runs)
                return
        versions = self.registry.models.get(held.key, {})
        entry = versions.get(held.version)
        if entry is None:
            return
        await self.registry.unload(held.key, held.version)
        now = versions.get(held.version)
        if now is not None and not now.ready:  # (unless another replica of it was served meanwhile)
            del versions[held.version]
        if not versions and self.registry.models.get(held.key) is versions:
            self.registry.forget(held.key)

    async def close(self) -> None:
        for held in list(self.by_job.values()):
            await self.release(held)
