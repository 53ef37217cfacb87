"""A dev environment's token and port (shared/auth/devtoken.py): the same from the same secret, job and
attempt on both sides, another for another attempt, job or secret; the port in its range."""

from __future__ import annotations

from gpuyard.shared.auth.devtoken import PORT_BASE, PORT_SPAN, dev_env, dev_port, dev_token


def test_derived_the_same_on_both_sides_and_apart_otherwise():
    secret = b"s" * 32
    assert dev_token(secret, "job1", 1) == dev_token(secret, "job1", 1)
    assert len(dev_token(secret, "job1", 1)) == 64
    others = {dev_token(secret, "job1", 2), dev_token(secret, "job2", 1), dev_token(b"t" * 32, "job1", 1)}
    assert dev_token(secret, "job1", 1) not in others and len(others) == 3
    ports = {dev_port(secret, f"job{i}", 1) for i in range(200)}
    assert all(PORT_BASE <= p < PORT_BASE + PORT_SPAN for p in ports) and len(ports) > 150
    assert dev_env(secret, "job1", 1) == {
        "JUPYTER_TOKEN": dev_token(secret, "job1", 1),
        "GPUYARD_DEV_PORT": str(dev_port(secret, "job1", 1)),
    }
