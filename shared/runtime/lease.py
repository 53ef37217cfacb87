"""Leadership among replicas of one service: a lease held as a key in a NATS KV bucket.

The bucket's TTL is the lease's length. The holder writes the key with `create` (only if absent) and renews
it with `update` on the revision it last wrote (compare-and-swap), every third of the TTL; a holder that
dies stops renewing, the key ages out, and another replica's `create` succeeds. A holder that cannot renew
(another replica took over, NATS unreachable for longer than the TTL) stops leading at once.

Leadership only saves wasted work: the decisions themselves stay safe without it, because every write goes
through the event store's expected-version check.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable

from nats.js.api import KeyValueConfig, StorageType
from nats.js.errors import KeyNotFoundError, KeyValueError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from gpuyard.shared.bus.jetstream import Bus

log = logging.getLogger(__name__)

LEASES_BUCKET = "gpuyard-leases"


class Lease:
    def __init__(self, bus: Bus, name: str, holder: str, *, ttl: float = 10.0, replicas: int = 1):
        self.bus, self.name, self.holder = bus, name, holder
        self.ttl = ttl
        self.replicas = replicas
        self.kv: KeyValue | None = None
        self.revision: int | None = None
        self.renewed_at = 0.0

    @property
    def held(self) -> bool:
        return self.revision is not None and time.monotonic() - self.renewed_at < self.ttl

    async def open(self) -> None:
        self.kv = await self.bus.key_value(
            KeyValueConfig(
                bucket=LEASES_BUCKET,
                ttl=self.ttl,
                history=1,
                storage=StorageType.FILE,
                replicas=self.replicas,
                description="leader leases of GPUYARD services",
            )
        )

    def _value(self) -> bytes:
        return json.dumps({"holder": self.holder, "renewed": time.time()}).encode()

    async def acquire(self) -> bool:
        """Take the lease if nobody holds it."""
        assert self.kv is not None, "open() first"
        try:
            self.revision = await self.kv.create(self.name, self._value())
        except (KeyWrongLastSequenceError, KeyValueError):
            return False
        self.renewed_at = time.monotonic()
        return True

    async def renew(self) -> bool:
        assert self.kv is not None and self.revision is not None
        try:
            self.revision = await self.kv.update(self.name, self._value(), last=self.revision)
        except (KeyWrongLastSequenceError, KeyNotFoundError, KeyValueError):
            self.revision = None
            return False
        self.renewed_at = time.monotonic()
        return True

    async def release(self) -> None:
        if self.kv is not None and self.revision is not None:
            with contextlib.suppress(Exception):
                await self.kv.delete(self.name, last=self.revision)
        self.revision = None

    async def keep(
        self,
        on_gained: Callable[[], Awaitable[None]],
        on_lost: Callable[[], Awaitable[None]],
    ) -> None:
        """Hold the lease for as long as this runs: try to take it, renew it, and report each change."""
        leading = False
        standing_by = False  # said once per spell of waiting: another holder answered this one's try
        try:
            while True:
                if leading:
                    ok = False
                    with contextlib.suppress(Exception):
                        ok = await asyncio.wait_for(self.renew(), self.ttl / 3)
                    if not ok and not self.held:
                        leading = False
                        self.revision = None
                        log.warning("lost the %s lease", self.name)
                        await on_lost()
                else:
                    answered = False
                    with contextlib.suppress(Exception):
                        leading = await asyncio.wait_for(self.acquire(), self.ttl / 3)
                        answered = True
                    if leading:
                        standing_by = False
                        log.info("took the %s lease as %s", self.name, self.holder)
                        await on_gained()
                    elif answered and not standing_by:
                        standing_by = True
                        log.info("the %s lease is held by another: %s stands by", self.name, self.holder)
                await asyncio.sleep(self.ttl / 3)
        finally:
            await self.release()
