"""Through `gpuyard up` (real NATS, a real job's output): revoking a token ends the streams it opened, the live
event stream and a running job's output followed, and connecting again with it is a 401."""

from __future__ import annotations

import contextlib
import time

import httpx
import pytest

from gpuyard.client import ClientError

from .conftest import wait_for

pytestmark = pytest.mark.integration
WITNESS_TIMEOUT = 60.0
"""How long a test waits for a stream to end before it fails (a bound on a hang, not a speed)."""


def to_the_end(lines) -> list[str]:
    """What a stream still sends, to its end; fails if it goes on past WITNESS_TIMEOUT."""
    deadline = time.monotonic() + WITNESS_TIMEOUT
    rest = []
    for line in lines:
        assert time.monotonic() < deadline, f"the stream has not ended: {rest[-5:]}"
        rest.append(line)
    return rest


def test_revoking_a_token_ends_its_event_stream_and_the_output_it_follows(platform):
    admin = platform.client()
    created = admin.create_token(tenant="vision", user="ana")
    bearer = {"Authorization": f"Bearer {created.token}"}
    api = httpx.Client(base_url=platform.server, headers=bearer, timeout=WITNESS_TIMEOUT)
    job = api.post(
        "/v1/jobs", json={"command": "echo started; exec sleep 300", "resources": {"gpus": 1}}
    ).json()["job_id"]
    try:
        platform.wait_state(job, {"running"})
        wait_for(lambda: "started" in admin.logs(job), 30, what="the job's output")
        with (
            api.stream("GET", "/v1/events/stream") as events,
            api.stream("GET", f"/v1/jobs/{job}/logs", params={"follow": "true"}) as output,
        ):
            assert events.status_code == output.status_code == 200
            event_lines, output_lines = events.iter_lines(), output.iter_lines()
            assert next(event_lines) == ": connected"
            assert next(output_lines) == "started"
            admin.revoke_token(created.id)
            assert ": access ended: unknown or revoked token" in to_the_end(event_lines)
            assert to_the_end(output_lines) == []
        assert admin.job(job).state == "running"  # the job itself goes on: only its reader's access ended
        assert api.get("/v1/events/stream").status_code == 401
        assert api.get(f"/v1/jobs/{job}/logs", params={"follow": "true"}).status_code == 401
    finally:
        with contextlib.suppress(ClientError):  # (a job that already ended: nothing to cancel)
            admin.cancel(job)
        api.close()
