"""MongoDB's wire protocol, the part a current driver speaks: OP_MSG messages in, OP_MSG replies out.

A message is a 16-byte header (length, request id, the id it answers, op code) and a body: flag bits, then
sections: kind 0 holds the command document, kind 1 a named sequence of documents (`documents` of an insert,
`updates`, `deletes`) that belongs to the command under that name.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from typing import Any

import bson

OP_MSG = 2013
HEADER = struct.Struct("<iiii")
CHECKSUM_PRESENT = 1
MORE_TO_COME = 2
MAX_MESSAGE_BYTES = 48_000_000

_reply_ids = itertools.count(1)


class ProtocolError(Exception):
    """A message this stand-in does not read: the connection is closed, as a server would."""


async def read_command(reader: asyncio.StreamReader) -> tuple[int, int, dict[str, Any]]:
    """The next message's request id, flag bits and command, its document sequences merged in."""
    length, request_id, _, op_code = HEADER.unpack(await reader.readexactly(HEADER.size))
    if not HEADER.size < length <= MAX_MESSAGE_BYTES:
        raise ProtocolError(f"a message of {length} bytes")
    body = await reader.readexactly(length - HEADER.size)
    if op_code != OP_MSG:
        raise ProtocolError(
            f"op code {op_code}: only OP_MSG is spoken here (drivers for MongoDB 3.6 and later)"
        )
    flags = int.from_bytes(body[:4], "little")
    end = len(body) - (4 if flags & CHECKSUM_PRESENT else 0)
    command: dict[str, Any] | None = None
    sequences: dict[str, list[dict[str, Any]]] = {}
    at = 4
    while at < end:
        kind, size = body[at], int.from_bytes(body[at + 1 : at + 5], "little")
        if kind == 0:
            command = bson.decode(body[at + 1 : at + 1 + size])
        elif kind == 1:
            section = body[at + 5 : at + 1 + size]
            name, _, documents = section.partition(b"\0")
            sequences[name.decode()] = bson.decode_all(documents)
        else:
            raise ProtocolError(f"an OP_MSG section of kind {kind}")
        at += 1 + size
    if command is None:
        raise ProtocolError("an OP_MSG without a command")
    return request_id, flags, command | sequences


def reply(answering: int, document: dict[str, Any]) -> bytes:
    """An OP_MSG reply to request `answering`."""
    body = struct.pack("<IB", 0, 0) + bson.encode(document)
    return HEADER.pack(HEADER.size + len(body), next(_reply_ids), answering, OP_MSG) + body
