"""The submit service's context in process, for the API's unit tests: a real embedded event store and log
store, tokens from a file (or as given); no NATS (events are stored, not published)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from gpuyard.services.submit.app import create_app
from gpuyard.services.submit.context import SubmitContext
from gpuyard.services.submit.fastpath import FastSubmit
from gpuyard.services.submit.volumefolders import FolderVolumes
from gpuyard.shared.auth.tokens import Tokens
from gpuyard.shared.modelfiles.store import ModelStore
from gpuyard.shared.stores.events import EventStore, open_store
from gpuyard.shared.stores.ledger import JobLedger
from gpuyard.shared.stores.logs import LogStore, open_log_store
from gpuyard.shared.stores.readmodels.modelregistry import ModelRegistry
from gpuyard.shared.stores.readmodels.volumeregistry import VolumeRegistry

TOKENS = {
    "tok-vision": {"tenant": "vision", "user": "ana"},
    "tok-nlp": {"tenant": "nlp", "user": "bo"},
    "tok-admin": {"tenant": "ops", "user": "root", "admin": True},
}


@contextlib.contextmanager
def submit_context(
    tmp_path: Path, tokens: dict | Tokens = TOKENS, *, models: bool = False, volumes: bool = False, **fields
) -> Iterator[SubmitContext]:
    """Its files in `tmp_path` (made if missing: two contexts can take two sub-folders of one tmp_path);
    `tokens`: the table written to tmp_path/tokens.json, or a `Tokens` taken as it is; `models`: with a model
    registry (its files under tmp_path/models); `volumes`: with volumes (their folders under tmp_path/storage, the
    platform's own user's); `fields`: SubmitContext's others. Its stores are closed after."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = asyncio.run(open_store(f"sqlite:///{tmp_path / 'events.db'}"))
    logs = asyncio.run(open_log_store(f"sqlite:///{tmp_path / 'logs.db'}"))
    if not isinstance(tokens, Tokens):
        tokens_file = tmp_path / "tokens.json"
        tokens_file.write_text(json.dumps({"tokens": tokens}))
        tokens = Tokens(tokens_file)
    if models:
        fields["models"] = ModelRegistry(store, None, "/test", ModelStore(str(tmp_path / "models")))
    if volumes:
        fields["volumes"] = VolumeRegistry(store, None, "/test")
        fields["volume_files"] = FolderVolumes(tmp_path / "storage", lambda tenant: None)
    try:
        yield _context(store, logs, tokens, **fields)
    finally:
        asyncio.run(store.close())
        asyncio.run(logs.close())


def another_instance(ctx: SubmitContext, tokens: Tokens) -> SubmitContext:
    """A second submit instance on `ctx`'s stores (two on one machine): its own ledger, reading of the tokens,
    queue count and telemetry. `ctx`'s `submit_context` closes the stores."""
    return _context(ctx.store, ctx.logs, tokens)


def _context(store: EventStore, logs: LogStore, tokens: Tokens, **fields) -> SubmitContext:
    return SubmitContext(
        store=store, ledger=JobLedger(store, None, "/test"), tokens=tokens, logs=logs, **fields
    )


def submit_app(ctx: SubmitContext, fast: bool = True) -> FastAPI:
    """The submit API on `ctx`; `fast=False`: without its fast path for `POST /v1/jobs` (the route takes all)."""
    app = create_app(ctx)
    if not fast:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not FastSubmit]
    return app


@contextlib.contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """The app on a free loopback port, in a thread, for a client in this process (its URL)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30  # (a bound on a hang, not a speed)
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the API did not start"
            time.sleep(0.02)  # (polling for the server's start: a positive witness)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
