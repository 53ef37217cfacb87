"""The registry on its own: which version answers, failures that never replace a ready version, unloading."""

from __future__ import annotations

import asyncio

import pytest

from gpuyard.services.serving.errors import NotFound, Unavailable
from gpuyard.services.serving.registry import ModelRegistry, ModelSource, VersionState

from .models import BROKEN, Mlp


async def test_the_newest_ready_version_answers_and_a_failure_replaces_nothing():
    registry = ModelRegistry()
    assert (await registry.load("m", 1, ModelSource(Mlp(seed=1).bytes))).ready
    assert (await registry.load("m", 2, ModelSource(Mlp(seed=2).bytes))).ready
    assert registry.resolve("m").version == 2
    failed = await registry.load("m", 3, ModelSource(BROKEN))
    assert failed.state is VersionState.FAILED and registry.resolve("m").version == 2
    again = await registry.load("m", 2, ModelSource(BROKEN))  # a failed reload of a READY version
    assert again.state is VersionState.FAILED and registry.resolve("m", "2").ready
    with pytest.raises(Unavailable, match="version 3 is FAILED: ONNX Runtime cannot load"):
        registry.resolve("m", "3")
    with pytest.raises(NotFound):
        registry.resolve("m", "4")
    with pytest.raises(NotFound):
        registry.resolve("other")
    await registry.unload("m", 2)
    assert registry.resolve("m").version == 1
    await registry.close()
    with pytest.raises(Unavailable, match="no ready version"):
        registry.resolve("m")


async def test_a_version_unloaded_while_it_loads_stays_unloaded():
    registry = ModelRegistry()
    loading = asyncio.ensure_future(registry.load("m", 1, ModelSource(Mlp().bytes)))
    await asyncio.sleep(0)
    assert registry.models["m"][1].state is VersionState.LOADING
    await registry.unload("m")
    entry = await loading
    assert (
        entry.state is VersionState.UNAVAILABLE and registry.models["m"][1].state is VersionState.UNAVAILABLE
    )


async def test_load_model_uses_the_lookup_for_a_name_never_held():
    registry = ModelRegistry(lookup=lambda name: {1: ModelSource(Mlp().bytes)} if name == "known" else {})
    (entry,) = await registry.load_model("known")
    assert entry.ready and registry.resolve("known").version == 1
    with pytest.raises(NotFound):
        await registry.load_model("unknown")
    await registry.close()
