"""Ports picked ahead of their owner (`gpuyard/supervisor/ports.py`): below the kernel's ephemeral range, where no socket
bound to port 0 in the meantime can take one."""

from __future__ import annotations

import socket

from gpuyard.supervisor import ports


def test_ports_are_picked_apart_below_the_ephemeral_range_and_free():
    low, _high = ports.ephemeral_range()
    picked = ports.free_ports("127.0.0.1", 20)
    assert len(set(picked)) == 20
    assert all(ports.LOWEST <= p < low for p in picked)
    for port in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_range_that_leaves_no_room_below_falls_back_to_the_kernels_choice(monkeypatch):
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    picked = ports.free_ports("127.0.0.1", 3)
    assert len(set(picked)) == 3 and all(p > 0 for p in picked)


def test_a_taken_port_is_not_free():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        assert not ports.port_free("127.0.0.1", taken)


def test_ports_named_for_what_is_not_bound_yet_are_never_picked():
    low, _high = ports.ephemeral_range()
    # all of the range but three ports: a random pick lands on one of those once in thousands
    named = frozenset(range(ports.LOWEST, low - 3))
    picked = ports.free_ports("127.0.0.1", 5, named)
    assert len(set(picked)) == 5 and not named & set(picked)


def wanted(what: str, port: int, source: str, host: str = "127.0.0.1") -> ports.Wanted:
    return ports.Wanted(what, host, port, source, f"pass {source}")


def test_every_port_free_and_apart_is_no_conflict():
    a, b = ports.free_ports("127.0.0.1", 2)
    assert ports.conflict([wanted("the API", a, "--port"), wanted("NATS", b, "--nats-port")]) is None


def test_a_port_taken_by_a_socket_is_one_line_naming_the_port_what_and_its_setting():
    free = ports.free_ports("127.0.0.1", 1)[0]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, not even listening: still not the platform's to take
        taken = s.getsockname()[1]
        said = ports.conflict(
            [wanted("the API", free, "--port"), wanted("the serving API", taken, "--serving-port")]
        )
    assert said == (
        f"port {taken} for the serving API is in use on 127.0.0.1: stop what uses it or pass --serving-port"
    )


def test_two_of_them_on_one_port_say_which_settings_give_it_before_any_is_bound():
    port = ports.free_ports("127.0.0.1", 1)[0]
    assert ports.conflict([wanted("the API", port, "--port"), wanted("NATS", port, "--nats-port")]) == (
        f"--port and --nats-port are both {port}: the API and NATS need a port each"
    )
    same = [
        wanted(f"the health endpoints of {n}", port, "GPUYARD_HEALTH_PORT") for n in ("submit", "scheduler")
    ]
    assert ports.conflict(same) == (
        f"GPUYARD_HEALTH_PORT is {port} for both the health endpoints of submit and the health endpoints of "
        "scheduler: pass GPUYARD_HEALTH_PORT"
    )


def test_every_address_and_one_of_them_is_one_port_two_addresses_are_two():
    port = ports.free_ports("127.0.0.1", 1)[0]
    anywhere = wanted("the API", port, "--port", host="0.0.0.0")
    assert ports.conflict([anywhere, wanted("NATS", port, "--nats-port")]) is not None
    apart = [wanted("the API", port, "--port"), wanted("NATS", port, "--nats-port", host="127.0.0.2")]
    assert ports.conflict(apart) is None
