"""Reading a request's body in ASGI middleware, and handing it on to the app as if it had not been read."""

from __future__ import annotations


class BodyTooLarge(Exception):
    pass


async def read_body(receive, limit: int | None = None) -> bytes | None:
    """The whole request body; None when the client went away first. Raises BodyTooLarge as soon as more
    than `limit` bytes have come."""
    body, more = b"", True
    while more:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        more = message.get("more_body", False)
        if limit is not None and len(body) > limit:
            raise BodyTooLarge
    return body


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
