"""What a service's /readyz says of its bus (`gpuyard.shared.bus.busstate.BusState`): a reconnect and a
stream leader election are told while they last and, once over, as the last trouble with when it ended."""

from __future__ import annotations

import pytest
from nats.errors import NoRespondersError
from nats.js.errors import APIError, NoStreamResponseError

from gpuyard.shared.bus.busstate import BusState, jetstream_unanswered


class Clock:
    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_reconnect_is_told_while_it_lasts_and_after_it_ended():
    clock = Clock()
    state = BusState(clock)
    state.connected("nats://127.0.0.1:4222")
    assert state.report() == {"bus": {"state": "connected", "server": "nats://127.0.0.1:4222"}}
    state.disconnected()
    said = state.report()["bus"]
    assert said["state"] == "reconnecting to NATS (lost nats://127.0.0.1:4222)"
    assert said["since"] == "2023-11-14T22:13:20.000Z"
    clock.now += 0.5
    state.reconnected("nats://127.0.0.1:4223")
    said = state.report()["bus"]
    assert said["state"] == "connected" and said["server"] == "nats://127.0.0.1:4223"
    assert said["last_trouble"] == {
        "trouble": "reconnecting to NATS (lost nats://127.0.0.1:4222)",
        "since": "2023-11-14T22:13:20.000Z",
        "until": "2023-11-14T22:13:20.500Z",
        "ended": "reconnected to nats://127.0.0.1:4223",
    }


def test_jetstream_not_answering_is_told_until_a_publish_is_acknowledged():
    state = BusState(Clock())
    state.published()
    assert state.trouble is None  # (nothing to end)
    state.publish_failed(NoStreamResponseError())
    assert state.trouble is not None and state.trouble.startswith("JetStream not answering publishes")
    state.publish_failed(NoRespondersError())  # the same trouble goes on
    state.published()
    assert state.trouble is None
    assert state.report()["bus"]["last_trouble"]["ended"] == "JetStream answers again"


def test_a_publish_refused_for_the_event_itself_is_no_trouble_of_the_bus():
    state = BusState(Clock())
    state.publish_failed(APIError(code=400, description="bad subject"))
    state.publish_failed(ValueError("not an event"))
    assert state.trouble is None and "last_trouble" not in state.report()["bus"]


def test_while_reconnecting_a_failed_publish_leaves_the_reconnect_said():
    state = BusState(Clock())
    state.disconnected()
    state.publish_failed(TimeoutError())
    assert state.trouble == "reconnecting to NATS (lost its server)"
    state.published()  # (an ack while reconnecting ends nothing: the reconnect does)
    assert state.trouble == "reconnecting to NATS (lost its server)"


@pytest.mark.parametrize(
    ("exc", "unanswered"),
    [
        (NoRespondersError(), True),
        (NoStreamResponseError(), True),
        (TimeoutError("no ack"), True),
        (APIError(code=503, description="JetStream system temporarily unavailable"), True),
        (APIError(code=400, description="bad request"), False),
        (RuntimeError("other"), False),
    ],
)
def test_which_failures_say_that_jetstream_did_not_answer(exc, unanswered):
    assert jetstream_unanswered(exc) is unanswered
