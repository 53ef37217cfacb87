"""What a download route answers for a path of a folder that jobs write to (a volume, a job's outputs): a file as
it is, or a folder as an uncompressed tar stream, sent as it is read, from a folder on disk (`SafeFolder`: never
through a link, never a file that is not the folder's user's) or of an object store (`ObjectFolder`)."""

from __future__ import annotations

import asyncio

from fastapi import HTTPException, status
from fastapi.responses import StreamingResponse

from gpuyard.services.submit.rawconnection import FileAnswer
from gpuyard.shared.runtime.safefolder import NotThere, ReadableFolder, SafeFolder


def attachment(name: str) -> str:
    """A Content-Disposition naming the file to save as, in ASCII (a job names its files as it likes)."""
    safe = name.encode("ascii", "replace").decode().replace('"', "_").replace("?", "_")
    return f'attachment; filename="{safe}"'


async def file_or_tree(folder: ReadableFolder, where: str, top: str, missing: str) -> StreamingResponse:
    """The file at `where` (clean), or the folder there as a tar stream (its entries under its own name; the
    whole folder's under `top`), read as it is sent. 404 with `missing` for nothing there, a link, or a file
    that may not be read."""
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
        if isinstance(folder, SafeFolder):  # (a file of its own: the kernel can send it)
            fd, st = await asyncio.to_thread(folder.open_file, where)
            return FileAnswer(
                fd, st.st_size, {"Content-Disposition": attachment(name)}, "application/octet-stream"
            )
        size, chunks = await asyncio.to_thread(folder.read_file, where)
    except NotThere as exc:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(exc)) from None
    return StreamingResponse(
        chunks,
        media_type="application/octet-stream",
        headers={"Content-Length": str(size), "Content-Disposition": attachment(name)},
    )
