"""The submit service's context in process, for the API's unit tests: a real embedded event store and log
store, tokens from a file; no NATS (events are stored, not published)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

from services.submit.context import SubmitContext
from shared.ledger import JobLedger
from shared.logstore import open_log_store
from shared.modelregistry import ModelRegistry
from shared.modelstore import ModelStore
from shared.store import open_store
from shared.tokens import Tokens

TOKENS = {
    "tok-vision": {"tenant": "vision", "user": "ana"},
    "tok-nlp": {"tenant": "nlp", "user": "bo"},
    "tok-admin": {"tenant": "ops", "user": "root", "admin": True},
}


@contextlib.contextmanager
def submit_context(
    tmp_path: Path, tokens: dict = TOKENS, *, models: bool = False, **fields
) -> Iterator[SubmitContext]:
    """`models`: with a model registry (its files under tmp_path/models); `fields`: SubmitContext's others."""
    store = asyncio.run(open_store(f"sqlite:///{tmp_path / 'events.db'}"))
    tokens_file = tmp_path / "tokens.json"
    tokens_file.write_text(json.dumps({"tokens": tokens}))
    if models:
        fields["models"] = ModelRegistry(store, None, "/test", ModelStore(str(tmp_path / "models")))
    context = SubmitContext(
        store=store,
        ledger=JobLedger(store, None, "/test"),
        tokens=Tokens(tokens_file),
        logs=asyncio.run(open_log_store(f"sqlite:///{tmp_path / 'logs.db'}")),
        **fields,
    )
    try:
        yield context
    finally:
        asyncio.run(store.close())
        asyncio.run(context.logs.close())
