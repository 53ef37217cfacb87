"""Files as the API lists them: a volume's, a job's outputs'."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field

from gpuyard.shared.contracts.api.common import Out


class FileOut(Out):
    path: str = Field(description="Relative to the top of the folder listed (the volume, the job's outputs).")
    kind: Literal["file", "dir", "other"] = Field(
        description="`other`: a link or a special file, never read."
    )
    size_bytes: int
    modified_at: datetime


class FileListOut(Out):
    path: str
    items: list[FileOut]
    truncated: bool = Field(description="The folder holds more entries than one listing answers.")
