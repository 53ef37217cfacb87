"""Reading a request's body: in one pass whatever the number of chunks it comes in (never appended chunk after
chunk, which copies everything read so far each time), and never before the caller is authenticated: a body
for the API from a caller that carries no token, or one refused, is answered 401 before a byte of it is read,
and so is a body over the limit (413) when it says its length."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from gpuyard.services.submit.body import BodyTooLarge, read_body, replaying
from gpuyard.shared.auth.jobtokens import PREFIX
from tests.unit.services.submit.submitctx import TOKENS, submit_app, submit_context

VISION = {"Authorization": "Bearer tok-vision"}
HALF_A_GIB = 500 << 20


class Chunk(bytes):
    """A body's chunk that counts the times it is appended to the bytes read before it (`body += chunk`
    calls it, as a subclass of the left operand's type; `b"".join` does not)."""

    appended = 0

    def __radd__(self, other: bytes) -> bytes:
        Chunk.appended += 1
        return bytes(other) + bytes(self)


def receiving(chunks: list[bytes], pulled: list[int] | None = None):
    """An ASGI `receive` giving `chunks` as one request's body; `pulled` counts the messages taken."""
    messages = iter(
        [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
    )

    async def receive():
        if pulled is not None:
            pulled.append(1)
        return next(messages, {"type": "http.disconnect"})

    return receive


def test_a_body_of_many_chunks_is_joined_once_never_appended_chunk_after_chunk():
    Chunk.appended = 0
    chunks = [Chunk(bytes([i % 251]) * 64) for i in range(20_000)]
    body = asyncio.run(read_body(receiving(chunks)))
    assert body == b"".join(chunks) and len(body) == 20_000 * 64
    assert Chunk.appended == 0


def test_a_body_of_one_chunk_is_that_chunk_not_a_copy():
    chunk = b"x" * 100_000
    assert asyncio.run(read_body(receiving([chunk]))) is chunk
    assert asyncio.run(read_body(receiving([b""]))) == b""


def test_reading_stops_at_the_first_chunk_over_the_limit():
    pulled: list[int] = []
    with pytest.raises(BodyTooLarge):
        asyncio.run(read_body(receiving([b"x" * 600] * 10, pulled), limit=1000))
    assert len(pulled) == 2  # the second chunk went over: the other eight were never asked for


def test_a_client_gone_is_no_body_and_a_body_read_is_handed_on_as_it_came():
    assert asyncio.run(read_body(receiving([]))) is None

    async def handed_on():
        replay = replaying(b"spec", receiving([]))
        return await replay(), await replay()

    first, then = asyncio.run(handed_on())
    assert first == {"type": "http.request", "body": b"spec", "more_body": False}
    assert then == {"type": "http.disconnect"}


# ---------------------------------------------------------------- nothing is read before the caller is known


@pytest.fixture
def app(tmp_path):
    with submit_context(tmp_path, TOKENS, models=True, max_body_bytes=4096, max_model_bytes=1 << 20) as ctx:
        yield submit_app(ctx)


async def post(
    app, path: str, headers: dict, declared: int | None, sent: list[int], at_hand: int = 4
) -> httpx.Response:
    """POST to `app` a body that would be `declared` bytes long (None: chunked, no length said), of which the
    client has only `at_hand` KB for now: `sent` counts the chunks (of 1 KB) the server asked for."""

    async def body() -> AsyncIterator[bytes]:
        for _ in range(at_hand):
            sent.append(1)
            yield b"\0" * 1024
        await asyncio.Event().wait()  # (the rest never comes: a server that waits for it never answers)

    length = {"Content-Length": str(declared)} if declared is not None else {}
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://testserver"
    ) as client:
        return await client.post(path, content=body(), headers={**headers, **length})


@pytest.mark.parametrize("declared", [HALF_A_GIB, None], ids=["content-length", "chunked"])
@pytest.mark.parametrize(
    ("path", "headers", "reason"),
    [
        ("/v1/models?name=big", {}, "missing bearer token"),
        ("/v1/models?name=big", {"Authorization": "Bearer nope"}, "unknown"),
        ("/v1/models?name=big", {"Authorization": "Basic dmlzaW9u"}, "missing bearer token"),
        ("/v1/jobs", {}, "missing bearer token"),
        ("/v1/jobs/validate", {"Authorization": "Bearer nope"}, "unknown"),
        ("/v1/admin/tokens", {"Authorization": f"Bearer {PREFIX}forged"}, "POST /v1/models only"),
    ],
)
async def test_a_caller_that_may_not_send_a_body_is_refused_before_any_of_it_is_read(
    app, path, headers, reason, declared
):
    sent: list[int] = []
    answer = await post(app, path, headers, declared, sent)
    assert answer.status_code == 401 and reason in answer.json()["detail"], answer.text
    assert answer.headers["www-authenticate"] == "Bearer"
    assert sent == []  # not one chunk was asked for


async def test_a_model_over_its_limit_is_refused_from_its_length_alone_once_its_caller_is_known(app):
    sent: list[int] = []
    answer = await post(app, "/v1/models?name=big", VISION, HALF_A_GIB, sent)
    assert answer.status_code == 413 and "over 1 MiB" in answer.json()["detail"], answer.text
    assert sent == []


async def test_another_body_over_the_api_limit_is_refused_from_its_length_alone(app):
    sent: list[int] = []
    answer = await post(app, "/v1/jobs", VISION, HALF_A_GIB, sent)
    assert answer.status_code == 413 and "over 4096 bytes" in answer.json()["detail"], answer.text
    assert sent == []


async def test_a_chunked_body_over_the_api_limit_is_refused_once_the_limit_is_passed(app):
    sent: list[int] = []
    answer = await post(app, "/v1/jobs", VISION, None, sent, at_hand=8)
    assert answer.status_code == 413 and "over 4096 bytes" in answer.json()["detail"], answer.text
    assert len(sent) == 5  # read up to the limit (4096 bytes) and the chunk past it, no further


def test_every_route_of_the_api_needs_a_token_so_the_early_refusal_refuses_nothing_a_route_would_take(app):
    """`BodyLimit` refuses a body to /v1 from a caller without a token before any route sees it: right only
    while every operation there is one that authenticates (the document says so: each names its security)."""
    document = app.openapi()
    operations = [
        (method, path) for path, ops in document["paths"].items() if path.startswith("/v1/") for method in ops
    ]
    assert operations
    unguarded = [
        (method, path) for method, path in operations if not document["paths"][path][method].get("security")
    ]
    assert unguarded == []
