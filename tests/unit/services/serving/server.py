"""A real uvicorn server for an ASGI app, in a thread of its own with its own event loop, on a port the
kernel picked (the socket is bound before the server starts, so no other test can take it)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time

import uvicorn


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self):  # the test runner keeps its own signal handlers
        yield


class RunningServer:
    def __init__(self, app, server: _Server, thread: threading.Thread, port: int, loop):
        self.app = app
        self.loop: asyncio.AbstractEventLoop = loop
        self.server = server
        self.thread = thread
        self.port = port
        self.url = f"127.0.0.1:{port}"  # what tritonclient takes
        self.base = f"http://{self.url}"

    def call(self, coroutine, timeout: float = 10):
        """Run `coroutine` on the server's own event loop (where the registry's batchers live)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)


@contextlib.contextmanager
def serve(app):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = _Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    holder: dict = {}

    def run():
        loop = asyncio.new_event_loop()
        holder["loop"] = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(server.serve(sockets=[sock]))
        loop.close()

    thread = threading.Thread(target=run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    running = RunningServer(app, server, thread, port, holder["loop"])
    try:
        yield running
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
