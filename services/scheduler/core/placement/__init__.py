"""Placement policies side by side; `make_policy(name, popularity)` builds one for a cycle or a replay."""

from __future__ import annotations

from gpuyard.services.scheduler.core.fragmentation import fragmenter_for
from gpuyard.services.scheduler.core.placement.base import Choice, PlacementPolicy
from gpuyard.services.scheduler.core.placement.bestfit import BestFit
from gpuyard.services.scheduler.core.placement.fgd import Fgd
from gpuyard.services.scheduler.core.placement.firstfit import FirstFit
from gpuyard.services.scheduler.core.placement.gpuyard import GpuYard
from gpuyard.shared.policies import Policy

POLICIES: dict[Policy, type[PlacementPolicy]] = {p.name: p for p in (FirstFit, BestFit, Fgd, GpuYard)}


def make_policy(name: Policy | str, popularity: tuple = ()) -> PlacementPolicy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown placement policy {name!r}; choose from {', '.join(sorted(POLICIES))}"
        ) from None
    return cls(fragmenter_for(popularity) if cls.needs_popularity else None)


__all__ = ["POLICIES", "BestFit", "Choice", "Fgd", "FirstFit", "GpuYard", "PlacementPolicy", "make_policy"]
