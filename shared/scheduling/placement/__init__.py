"""Placement policies side by side; `make_policy(name, popularity)` builds one for a cycle or a replay."""

from __future__ import annotations

from gpuyard.shared.contracts.policies import Policy
from gpuyard.shared.scheduling.fragmentation import fragmenter_for
from gpuyard.shared.scheduling.placement.base import Choice, PlacementPolicy
from gpuyard.shared.scheduling.placement.bestfit import BestFit
from gpuyard.shared.scheduling.placement.fgd import Fgd
from gpuyard.shared.scheduling.placement.firstfit import FirstFit
from gpuyard.shared.scheduling.placement.gpuyard import GpuYard

# keyed by `Policy` (a StrEnum): its plain name finds the policy too
POLICIES: dict[str, type[PlacementPolicy]] = {p.name: p for p in (FirstFit, BestFit, Fgd, GpuYard)}


def make_policy(name: Policy | str, popularity: tuple = ()) -> PlacementPolicy:
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(
            f"unknown placement policy {name!r}; choose from {', '.join(sorted(POLICIES))}"
        ) from None
    return cls(fragmenter_for(popularity) if cls.needs_popularity else None)


__all__ = ["POLICIES", "BestFit", "Choice", "Fgd", "FirstFit", "GpuYard", "PlacementPolicy", "make_policy"]
