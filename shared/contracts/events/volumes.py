"""The events of volumes: a tenant's named, sized folders of data that jobs mount (docs/storage.md)."""

from __future__ import annotations

from pydantic import Field

from gpuyard.shared.contracts.events.envelope import EventData, event
from gpuyard.shared.contracts.events.subjects import Subject
from gpuyard.shared.contracts.fieldtypes import NAME_PATTERN


class _VolumeEvent(EventData):
    name: str = Field(..., pattern=NAME_PATTERN)
    tenant: str = Field(..., pattern=NAME_PATTERN, description="The tenant that owns the volume.")

    def entity(self) -> str | None:
        return f"{self.tenant}/{self.name}"  # a volume's name is its tenant's: two tenants may use the same


@event(Subject.VOLUME_CREATED)
class VolumeCreated(_VolumeEvent):
    """A volume was made, empty: its folder is in the storage root, its size counted against its tenant's
    volume quota."""

    size_bytes: int = Field(..., ge=1, description="Its size: what it may hold; uploads past it are refused.")
    by: str = Field("", description="Who made it (the token's user).")


@event(Subject.VOLUME_FILES_WRITTEN)
class VolumeFilesWritten(_VolumeEvent):
    """Files were uploaded into a volume, whole (an upload is all or nothing)."""

    path: str = Field(
        ..., description="Where, relative to the volume's top: the file, or the folder of a tree."
    )
    files: int = Field(..., ge=0, description="How many files were written.")
    bytes: int = Field(..., ge=0, description="How many bytes they hold.")
    by: str = ""


@event(Subject.VOLUME_FILES_DELETED)
class VolumeFilesDeleted(_VolumeEvent):
    """A file or a folder (with what it held) was removed from a volume."""

    path: str
    files: int = Field(..., ge=0)
    bytes: int = Field(..., ge=0)
    by: str = ""


@event(Subject.VOLUME_DELETED)
class VolumeDeleted(_VolumeEvent):
    """A volume and every file in it were removed; its name may be used again."""

    bytes: int = Field(0, ge=0, description="What its files held.")
    by: str = ""
