"""`gpuyard up` makes the executors' gateway token in its data dir and tells the services where it is, unless the
environment names another (gpuyard/supervisor/plan.py, datadir.py)."""

from __future__ import annotations

import stat

from gpuyard.shared.auth.gatewaytoken import GatewayToken
from gpuyard.shared.settings.gateway import GATEWAY_TOKEN_FILE
from gpuyard.supervisor.datadir import ensure_gateway_token
from gpuyard.supervisor.plan import gateway_env


def test_the_token_is_made_private_once_and_read_by_the_services(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUYARD_GATEWAY_TOKEN_FILE", raising=False)
    ensure_gateway_token(tmp_path)
    path = tmp_path / GATEWAY_TOKEN_FILE
    first = path.read_bytes()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first.strip()) >= 32
    ensure_gateway_token(tmp_path)
    assert path.read_bytes() == first
    token = GatewayToken(path, make=False)
    assert token.allows(f"Bearer {first.strip().decode()}") and not token.allows("Bearer nope")
    assert not token.allows(None)


def test_the_services_are_told_where_it_is_unless_the_environment_says(tmp_path):
    assert gateway_env(tmp_path, {}) == {"GPUYARD_GATEWAY_TOKEN_FILE": str(tmp_path / GATEWAY_TOKEN_FILE)}
    assert gateway_env(tmp_path, {"GPUYARD_GATEWAY_TOKEN_FILE": "/run/secrets/gw"}) == {}
