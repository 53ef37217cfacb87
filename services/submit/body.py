"""Reading a request's body in ASGI middleware, and handing it on to the app as if it had not been read.

The chunks are kept as they come and joined once (`b"".join`): reading a body costs its length, however many
chunks it comes in (appending each chunk to the bytes read so far would copy them all again every time)."""

from __future__ import annotations


class BodyTooLarge(Exception):
    pass


async def read_body(receive, limit: int | None = None) -> bytes | None:
    """The whole request body; None when the client went away first. Raises BodyTooLarge as soon as more
    than `limit` bytes have come."""
    chunks: list[bytes] = []
    size, more = 0, True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None
        chunk = message.get("body", b"")
        more = message.get("more_body", False)
        if chunk:
            size += len(chunk)
            if limit is not None and size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def replaying(body: bytes, receive):
    """A `receive` that gives the app a body already read, then what the connection says next."""
    replayed = False

    async def replay():
        nonlocal replayed
        if replayed:
            return await receive()
        replayed = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay
