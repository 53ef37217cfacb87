"""docs/operations.md, "Limits: what one tenant can take", names every setting that bounds what a tenant takes.

A setting whose name says it is a bound (`max_…`, `…_max_bytes`, `…budget…`, `…limit…`, `model_check_…`) is
either in that section or named below as one that bounds no tenant."""

from __future__ import annotations

import re
from pathlib import Path

from gpuyard.docsgen.settings import TABLES

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
TITLE = "## Limits: what one tenant can take"
NOT_A_TENANTS_BOUND = {
    "max_batch_size": "dynamic batching's batch, the platform's own choice",
    "max_queue_delay_us": "dynamic batching's wait",
    "max_deliver": "JetStream redeliveries of one event to a consumer",
    "cgroup_limits": "whether the executor enforces a job's own resources (docs/executor.md)",
    "limit_gpu_cores": "whether HAMi also caps a fractional GPU's compute share (Kubernetes backend)",
}
BOUND = re.compile(r"^max_|_max_bytes$|budget|limit|^model_check_")


def limit_settings() -> set[str]:
    """Of every settings model docs/operations.md documents (`settingsdocs.TABLES`)."""
    return {name for table in TABLES for name in table.model.model_fields if BOUND.search(name)}


def section() -> str:
    text = DOC.read_text()
    start = text.index(TITLE)
    end = text.index("\n## ", start + len(TITLE))
    return text[start:end]


def test_the_limits_section_names_every_setting_that_bounds_a_tenant():
    listed = section()
    missing = sorted(
        name for name in limit_settings() - NOT_A_TENANTS_BOUND.keys() if f"`{name}`" not in listed
    )
    assert not missing, f"add them to {TITLE!r} in docs/operations.md (or to NOT_A_TENANTS_BOUND): {missing}"


def test_the_settings_said_to_bound_no_tenant_exist():
    assert NOT_A_TENANTS_BOUND.keys() <= limit_settings()
