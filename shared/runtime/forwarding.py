"""Forwarding an HTTP request or a WebSocket to another server, streamed both ways: what the submit service's
job proxy does towards a node's executor gateway, and the gateway towards a port a replica listens on
(docs/access.md). Hop-by-hop headers stay on their hop; `drop` names more that must not travel on (the
platform's credentials), `add` those the next hop needs (its token)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping
from urllib.parse import urlsplit

import websockets
from httptools import HttpParserError
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from gpuyard.shared.runtime.upstream import Upstream

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
WEBSOCKET_OWN = frozenset(
    {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"}
)
OPEN_SECONDS = 10.0
GOING_AWAY = 1001
SMALL = 64 * 1024
"""An answer of at most this many bytes, by its Content-Length, is read whole and sent on at once."""


def passed_headers(
    raw: Iterable[tuple[bytes, bytes]], drop: Iterable[str] = (), add: Mapping[str, str] | None = None
) -> list[tuple[str, str]]:
    """The headers that travel on: none of the hop's own nor of `drop`, then `add`."""
    dropped = HOP_BY_HOP | {name.lower() for name in drop} | {name.lower() for name in (add or {})}
    kept = [
        (name.decode("latin-1"), value.decode("latin-1"))
        for name, value in raw
        if name.decode("latin-1").lower() not in dropped
    ]
    return kept + list((add or {}).items())


def without_cookie(headers: list[tuple[str, str]], cookie_name: str) -> list[tuple[str, str]]:
    """`headers` with the cookie `cookie_name` taken out of every Cookie header (the others stay)."""
    out = []
    for name, value in headers:
        if name.lower() == "cookie":
            parts = [p for p in value.split(";") if p.strip().split("=", 1)[0] != cookie_name]
            if not any(p.strip() for p in parts):
                continue
            value = ";".join(parts).strip()
        out.append((name, value))
    return out


def has_body(request: Request) -> bool:
    return "content-length" in request.headers or "transfer-encoding" in request.headers


async def forward_http(
    request: Request, upstream: Upstream, url: str, headers: list[tuple[str, str]]
) -> Response:
    """`request` sent on to `url` (its query included) with `headers`, its body streamed; the answer streamed
    back. 502 when `url` cannot be reached."""
    sent = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    # (the caller's framing is its hop's own: a body it sent chunked goes on chunked, in this hop's chunks)
    chunked = "content-length" not in request.headers and "transfer-encoding" in request.headers
    sent.append((b"Host", urlsplit(url).netloc.encode("latin-1")))
    try:
        answer = await upstream.send(
            request.method, url, sent, request.stream() if has_body(request) else None, chunked=chunked
        )
    except (OSError, TimeoutError, HttpParserError) as exc:
        return JSONResponse({"detail": f"{url_words(url)} cannot be reached: {type(exc).__name__}"}, 502)
    kept = [(k.lower(), v) for k, v in answer.headers if k.decode("latin-1").lower() not in HOP_BY_HOP]
    if 0 <= declared_length(kept) <= SMALL:  # (read whole and sent on in one write: no stream to run)
        try:
            body = await answer.read()
        except (OSError, HttpParserError) as exc:
            await answer.close()
            return JSONResponse(
                {"detail": f"{url_words(url)} broke off its answer: {type(exc).__name__}"}, 502
            )
        await answer.close()
        small = Response(body, status_code=answer.status)
        small.raw_headers = kept
        return small
    response = StreamingResponse(
        answer.stream(), status_code=answer.status, background=BackgroundTask(answer.close)
    )
    response.raw_headers = kept
    return response


def declared_length(headers: list[tuple[bytes, bytes]]) -> int:
    """An answer's Content-Length; -1 when it says none (or one that is not a number)."""
    value = dict(headers).get(b"content-length", b"")
    return int(value) if value.isdigit() else -1


def url_words(url: str) -> str:
    return url.split("?", 1)[0]


async def forward_websocket(
    ws: WebSocket,
    url: str,
    headers: list[tuple[str, str]],
    *,
    on_client_message: Callable[[], None] | None = None,
) -> None:
    """The WebSocket `ws` (not accepted yet) joined to one opened to `url` with `headers`: accepted with the
    subprotocol the other side chose, or refused with the other side's own refusal (its status), and every
    frame passed on both ways until one side closes. `on_client_message()` is called for each message `ws`'s
    client sends (before it is passed on: it must not wait)."""
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",") if p.strip()]
    sent = [(k, v) for k, v in headers if k.lower() not in WEBSOCKET_OWN]
    try:
        upstream = await websockets.connect(
            url,
            additional_headers=sent,
            subprotocols=offered or None,  # type: ignore[arg-type]
            open_timeout=OPEN_SECONDS,
            max_size=None,
            compression=None,
            user_agent_header=None,
            proxy=None,
        )
    except InvalidStatus as exc:
        body = exc.response.body or b""
        media = exc.response.headers.get("content-type", "text/plain")
        return await ws.send_denial_response(Response(body, exc.response.status_code, media_type=media))
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        detail = f"{url_words(url)} cannot be reached: {type(exc).__name__}"
        return await ws.send_denial_response(JSONResponse({"detail": detail}, 502))
    async with upstream:
        await ws.accept(subprotocol=upstream.subprotocol)
        await join(ws, upstream, on_client_message)


async def join(
    ws: WebSocket,
    upstream: websockets.ClientConnection,
    on_client_message: Callable[[], None] | None = None,
) -> None:
    """Pass frames both ways until one side closes; the other is then closed with its code."""

    async def down() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in upstream:
                if isinstance(message, bytes):
                    await ws.send_bytes(message)
                else:
                    await ws.send_text(message)
        code = upstream.close_code or GOING_AWAY
        with contextlib.suppress(Exception):
            await ws.close(code if code != 1005 else 1000, upstream.close_reason or None)

    async def up() -> None:
        with contextlib.suppress(WebSocketDisconnect, ConnectionClosed, RuntimeError):
            while True:
                message = await ws.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if on_client_message is not None:
                    on_client_message()
                if (data := message.get("bytes")) is not None:
                    await upstream.send(data)
                elif (text := message.get("text")) is not None:
                    await upstream.send(text)
        await upstream.close()

    tasks = [asyncio.create_task(down()), asyncio.create_task(up())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
