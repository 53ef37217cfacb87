"""/readyz says what the service's bus went through (`HealthServer`'s `detail`: the bus's `BusState.report`),
whatever it answers: a real server on a free port, real HTTP requests."""

from __future__ import annotations

import httpx

from gpuyard.shared.bus.busstate import BusState
from gpuyard.shared.runtime.health import HealthServer


async def test_readyz_tells_the_bus_state_and_its_last_trouble():
    state = BusState()
    state.connected("nats://127.0.0.1:4222")
    health = HealthServer("executor", lambda: True, detail=state.report)
    port = await health.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
            state.disconnected()
            answer = await client.get("/readyz")
            assert answer.status_code == 200  # (its outbox keeps the service working meanwhile)
            said = answer.json()
            assert said["ready"] is True and said["service"] == "executor"
            assert said["bus"]["state"] == "reconnecting to NATS (lost nats://127.0.0.1:4222)"
            state.reconnected("nats://127.0.0.1:4223")
            said = (await client.get("/readyz")).json()["bus"]
            assert said["state"] == "connected" and said["server"] == "nats://127.0.0.1:4223"
            assert said["last_trouble"]["ended"] == "reconnected to nats://127.0.0.1:4223"
            assert (await client.get("/healthz")).json() == {"status": "ok", "service": "executor"}
    finally:
        await health.stop()
