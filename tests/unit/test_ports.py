"""Ports picked ahead of their owner (`gpuyard/ports.py`): below the kernel's ephemeral range, where no socket
bound to port 0 in the meantime can take one."""

from __future__ import annotations

import socket

from gpuyard import ports


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
