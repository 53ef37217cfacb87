"""Volumes and their files as the API takes and shows them."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field

from gpuyard.shared.contracts.api.common import Out
from gpuyard.shared.contracts.fieldtypes import Bytes, Name, Strict


class VolumeIn(Strict):
    """A volume to make: `{"name": "imagenet", "size": "50GB"}`."""

    name: Name = Field(..., description="Its name, the tenant's: lowercase letters, digits and '-'.")
    size: Bytes | None = Field(
        None, description="What it may hold, e.g. '50GB' (default: the platform's `volume_default_size`)."
    )


class VolumeOut(Out):
    name: str
    tenant: str
    size_bytes: int = Field(description="What it may hold: an upload past it is refused.")
    used_bytes: int | None = Field(
        None, description="What its files hold now (its description only: a listing leaves it out)."
    )
    files: int | None = Field(None, description="How many files it holds (its description only).")
    mounted_by: list[str] | None = Field(
        None,
        description="The live jobs that mount it (its description only): it cannot be deleted meanwhile.",
    )
    created_at: datetime
    created_by: str = ""


class VolumeListOut(Out):
    items: list[VolumeOut]
    quota_bytes: int = Field(description="What the tenant's volumes may hold together (0: no limit).")
    reserved_bytes: int = Field(description="What the tenant's volumes hold room for together: their sizes.")


class VolumeDeletedOut(Out):
    name: str
    tenant: str
    freed_bytes: int


class FilesWrittenOut(Out):
    volume: str
    path: str
    files: int
    bytes: int


class FilesDeletedOut(Out):
    volume: str
    path: str
    files: int
    bytes: int
