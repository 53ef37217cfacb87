"""What a download route answers for a path of a folder that jobs write to (a volume, a job's outputs): a file as
it is, or a folder as an uncompressed tar stream, sent as it is read (`SafeFolder`: never through a link, never
a file that is not the folder's user's)."""

from __future__ import annotations

import asyncio

from fastapi import HTTPException, status
from fastapi.responses import StreamingResponse

from gpuyard.shared.runtime.safefolder import NotThere, SafeFolder, chunks_of


def attachment(name: str) -> str:
    """A Content-Disposition naming the file to save as, in ASCII (a job names its files as it likes)."""
    safe = name.encode("ascii", "replace").decode().replace('"', "_").replace("?", "_")
    return f'attachment; filename="{safe}"'


async def file_or_tree(folder: SafeFolder, where: str, top: str, missing: str) -> StreamingResponse:
    """The file at `where` (clean), or the folder there as a tar stream (its entries under its own name; the
    whole folder's under `top`). 404 with `missing` for nothing there, a link, or a file that may not be read."""
    kind = await asyncio.to_thread(folder.kind_of, where)
    name = where.rpartition("/")[2] or top
    if kind == "dir":
        return StreamingResponse(
            folder.tar_chunks(where, top),
            media_type="application/x-tar",
            headers={"Content-Disposition": attachment(f"{name}.tar")},
        )
    try:
        if kind != "file":
            raise NotThere(missing)
        fd, st = await asyncio.to_thread(folder.open_file, where)
    except NotThere as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    return StreamingResponse(
        chunks_of(fd),
        media_type="application/octet-stream",
        headers={"Content-Length": str(st.st_size), "Content-Disposition": attachment(name)},
    )
