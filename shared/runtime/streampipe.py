"""Bytes carried from one asyncio stream to another, as a TCP forward carries them (`gpuyard port-forward`'s
listener, the Kubernetes backend's port-forward tunnels): asyncio alone, so that the client can use it."""

from __future__ import annotations

import asyncio

CHUNK = 64 * 1024


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes from `reader` to `writer` until the end of `reader`, which is then passed on (a half close, or a
    close where the writer cannot half close)."""
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        else:
            writer.close()
    except OSError:
        writer.close()
