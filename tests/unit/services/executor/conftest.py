"""Fixtures shared by the executor's unit tests."""

from __future__ import annotations

import pytest

from gpuyard.shared.stores.readmodels.volumeregistry import VolumeRegistry

from .fake_kube_api import FakeKubeApi
from .harness import Harness


@pytest.fixture
async def h(tmp_path):
    """A store, a ledger and a fake bus in `tmp_path`, to drive executors with (see `Harness`)."""
    harness = await Harness(tmp_path).open()
    yield harness
    await harness.close()


@pytest.fixture
def api():
    """A fake Kubernetes API server (`FakeKubeApi`) whose jobs' namespace is `jobs`."""
    return FakeKubeApi(namespace="jobs")


@pytest.fixture
def registry(h):
    """The volumes of the harness's store, as the Kubernetes backend finds them."""
    return VolumeRegistry(h.store, None, "/test")
