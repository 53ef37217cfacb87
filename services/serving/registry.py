"""The models this server holds, in memory: for each name its versions, each with its state (LOADING, READY,
FAILED with the reason, UNAVAILABLE once unloaded), its loaded model and its batcher.

Several versions coexist; without a version, a request goes to the newest READY one. A version that fails
to load is recorded as FAILED with its reason and never replaces a version that is READY, so the previous
one keeps serving."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from gpuyard.services.serving.batching import Batcher
from gpuyard.services.serving.errors import ModelLoadError, NotFound, Unavailable
from gpuyard.services.serving.runtime import OnnxModel, load_onnx

log = logging.getLogger(__name__)


class VersionState(StrEnum):
    LOADING = "LOADING"
    READY = "READY"
    FAILED = "FAILED"
    UNAVAILABLE = "UNAVAILABLE"  # unloaded; Triton's word


@dataclass(frozen=True)
class ModelSource:
    """Where a version comes from and how to serve it: what `load` needs, and `/load` reloads from."""

    artifact: Path | str | bytes
    sha256: str | None = None
    gpu: int | None = None
    intra_op_threads: int = 1
    max_batch_size: int = 0
    max_queue_delay_us: int = 0


@dataclass(eq=False)
class ModelVersion:
    name: str
    version: int
    state: VersionState
    reason: str = ""
    model: OnnxModel | None = None
    batcher: Batcher | None = None
    source: ModelSource | None = None

    @property
    def ready(self) -> bool:
        return self.state is VersionState.READY

    def loaded(self) -> tuple[OnnxModel, Batcher]:
        """Its model and batcher: a READY version has both (`ModelRegistry.resolve` gives only those)."""
        if self.model is None or self.batcher is None:
            raise Unavailable(f"model '{self.name}' {_describe(self)}")
        return self.model, self.batcher


SourceLookup = Callable[[str], dict[int, ModelSource]]
"""For `/load` of a model this registry never held: its versions and their sources (empty if unknown)."""


class ModelRegistry:
    def __init__(self, lookup: SourceLookup | None = None):
        self.models: dict[str, dict[int, ModelVersion]] = {}
        self.lookup = lookup

    # --- adding and removing ---------------------------------------------------------------------------

    def add(
        self,
        name: str,
        version: int,
        model: OnnxModel,
        *,
        max_batch_size: int = 0,
        max_queue_delay_us: int = 0,
        source: ModelSource | None = None,
    ) -> ModelVersion:
        """Serve a loaded `model` as `name` `version` (READY), replacing what that version was."""
        entry = ModelVersion(
            name,
            version,
            VersionState.READY,
            model=model,
            batcher=Batcher(model, max_batch_size, max_queue_delay_us),
            source=source,
        )
        old = self.models.setdefault(name, {}).get(version)
        self.models[name][version] = entry
        if old is not None and old.batcher is not None:
            old.batcher.close()  # what it has queued still runs
        return entry

    def add_failed(
        self, name: str, version: int, reason: str, source: ModelSource | None = None
    ) -> ModelVersion:
        """Record that `version` could not be loaded. A READY entry of the same version stays and serves."""
        entry = ModelVersion(name, version, VersionState.FAILED, reason=reason, source=source)
        current = self.models.get(name, {}).get(version)
        if current is None or not current.ready:
            self.models.setdefault(name, {})[version] = entry
        log.warning("model %s version %s failed to load: %s", name, version, reason)
        return entry

    async def load(self, name: str, version: int, source: ModelSource) -> ModelVersion:
        """Load `source` in a thread and serve it, or record why it failed (the returned entry says which)."""
        current = self.models.setdefault(name, {}).get(version)
        if current is None or current.state is not VersionState.READY:
            current = ModelVersion(name, version, VersionState.LOADING, source=source)
            self.models[name][version] = current
        try:
            model = await asyncio.to_thread(
                load_onnx,
                source.artifact,
                sha256=source.sha256,
                gpu=source.gpu,
                intra_op_threads=source.intra_op_threads,
            )
        except ModelLoadError as exc:
            return self.add_failed(name, version, str(exc), source)
        now = self.models.get(name, {}).get(version)
        if now is not current:  # unloaded (or forgotten) while it loaded: it stays so
            return now or ModelVersion(
                name, version, VersionState.UNAVAILABLE, reason="unloaded", source=source
            )
        return self.add(
            name,
            version,
            model,
            max_batch_size=source.max_batch_size,
            max_queue_delay_us=source.max_queue_delay_us,
            source=source,
        )

    async def load_model(self, name: str) -> list[ModelVersion]:
        """The model repository's `load`: (re)load every version of `name` from its sources, those this
        registry remembers or, for a name it never held, those `lookup` gives. NotFound if there are none."""
        sources = {v: e.source for v, e in self.models.get(name, {}).items() if e.source is not None}
        if not sources and self.lookup is not None:
            sources = self.lookup(name)
        if not sources:
            raise NotFound(f"unknown model '{name}'")
        return [await self.load(name, version, source) for version, source in sorted(sources.items())]

    async def unload(self, name: str, version: int | None = None) -> None:
        """Stop serving `name` (one version, or all): new requests are refused, queued ones still answered.
        The versions stay listed as UNAVAILABLE, and `load_model` can bring them back."""
        versions = self.models.get(name)
        if not versions or (version is not None and version not in versions):
            raise NotFound(f"unknown model '{name}'" + ("" if version is None else f" version {version}"))
        batchers = []
        for entry in [versions[version]] if version is not None else list(versions.values()):
            if entry.batcher is not None:
                batchers.append(entry.batcher)
            versions[entry.version] = ModelVersion(
                name, entry.version, VersionState.UNAVAILABLE, reason="unloaded", source=entry.source
            )
        for batcher in batchers:
            await batcher.aclose()

    def forget(self, name: str) -> None:
        """Drop `name` and every version of it from the registry (after `unload`)."""
        self.models.pop(name, None)

    async def close(self) -> None:
        for name in list(self.models):
            await self.unload(name)

    # --- finding ---------------------------------------------------------------------------------------

    def resolve(self, name: str, version: str | None = None, shown: str | None = None) -> ModelVersion:
        """The READY version a request names, or the newest READY one. NotFound for an unknown model or
        version, Unavailable for one that is not ready (with its state and reason). `shown`: the model's name
        in the messages, as the caller named it (default: `name`, the registry's key)."""
        shown = name if shown is None else shown
        versions = self.models.get(name)
        if not versions:
            raise NotFound(f"unknown model '{shown}'")
        if version is None or version == "":
            ready = [entry for entry in versions.values() if entry.ready]
            if not ready:
                states = "; ".join(_describe(e) for _, e in sorted(versions.items()))
                raise Unavailable(f"model '{shown}' has no ready version ({states})")
            return max(ready, key=lambda entry: entry.version)
        entry = versions.get(int(version)) if version.isdigit() else None
        if entry is None:
            raise NotFound(f"unknown version '{version}' of model '{shown}'")
        if not entry.ready:
            raise Unavailable(f"model '{shown}' {_describe(entry)}")
        return entry

    def ready_versions(self, name: str) -> list[int]:
        return sorted(v for v, entry in self.models.get(name, {}).items() if entry.ready)

    def index(self, ready_only: bool = False) -> list[ModelVersion]:
        return [
            entry
            for name in sorted(self.models)
            for _, entry in sorted(self.models[name].items())
            if entry.ready or not ready_only
        ]


def _describe(entry: ModelVersion) -> str:
    text = f"version {entry.version} is {entry.state.value}"
    return f"{text}: {entry.reason}" if entry.reason else text
