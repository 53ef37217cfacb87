"""Logging out of the dashboard ends the session on the server (shared/auth/sessions.py): a copy of its cookie,
and its CSRF token, are refused from then on, by every service that shares the data dir's record, and what
the session streams ends."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from fastapi.testclient import TestClient

from gpuyard.services.submit.app import create_app
from gpuyard.shared.auth import sessions
from tests.unit.services.submit.submitctx import submit_app, submit_context
from tests.unit.services.submit.test_stream_revocation import WITNESS_TIMEOUT, StreamBus, rest_of, served

HOST = "testserver"
ORIGIN = {"Origin": f"http://{HOST}"}


@pytest.fixture
def ctx(tmp_path):
    key = sessions.load_key(tmp_path / "data", None, without_it="no login")
    with submit_context(tmp_path, session_secret=key, session_lifetime=3600) as c:
        yield c


@pytest.fixture
def browser(ctx):
    with TestClient(create_app(ctx), base_url=f"http://{HOST}") as c:
        yield c


def log_in(client, token: str = "tok-vision") -> tuple[str, str]:
    """Logged in as the form does: the session's cookie and its pages' CSRF token."""
    assert (
        client.post("/login", data={"token": token}, headers=ORIGIN, follow_redirects=False).status_code
        == 303
    )
    csrf = re.search(r'<meta name="csrf-token" content="([^"]+)"', client.get("/jobs").text)
    assert csrf is not None
    return client.cookies.get(sessions.COOKIE), csrf.group(1)


def log_out(client, csrf: str) -> None:
    out = client.post("/logout", data={"csrf": csrf}, headers=ORIGIN, follow_redirects=False)
    assert out.status_code == 303 and out.headers["location"] == "/"


def test_a_copy_of_a_logged_out_sessions_cookie_and_csrf_token_are_refused(browser, ctx):
    cookie, csrf = log_in(browser)
    log_out(browser, csrf)
    with TestClient(create_app(ctx), base_url=f"http://{HOST}") as kept:  # whoever kept a copy of both
        kept.cookies.set(sessions.COOKIE, cookie)
        read = kept.get("/v1/jobs")
        assert read.status_code == 401 and "logged out" in read.json()["detail"]
        change = kept.post("/v1/jobs", json={"command": "x"}, headers={**ORIGIN, sessions.CSRF_HEADER: csrf})
        assert change.status_code == 401
        page = kept.get("/jobs", follow_redirects=False)  # the dashboard: to its login, as without a session
        assert page.status_code == 303 and page.headers["location"].startswith("/?next=")
        login_page = kept.get("/")
        assert 'name="token"' in login_page.text and "logged out" in login_page.text


def test_logging_out_ends_only_that_session(browser, ctx):
    _, csrf = log_in(browser)
    with TestClient(create_app(ctx), base_url=f"http://{HOST}") as other_browser:
        log_in(other_browser)  # the same token, another login
        log_out(browser, csrf)
        assert other_browser.get("/v1/jobs").status_code == 200
        assert browser.get("/v1/jobs").status_code == 401


def test_every_service_reading_the_data_dir_refuses_a_logged_out_session(tmp_path):
    data = tmp_path / "data"
    key = sessions.load_key(data, None, without_it="no login")
    cookie, session = sessions.issue(key, "tok_1", 3600)
    # another process of the platform: its own reading of the same key and record
    other = sessions.EndedSessions(data / sessions.SECRETS_DIR / sessions.ENDED_FILE)
    assert not other.ended(session)
    assert sessions.end(key, session)
    assert other.ended(session)
    with pytest.raises(sessions.SessionRefused, match="logged out"):
        sessions.read(key, cookie)
    assert not sessions.csrf_ok(key, session, sessions.csrf_token(key, session))
    record = data / sessions.SECRETS_DIR / sessions.ENDED_FILE
    assert record.stat().st_mode & 0o777 == 0o600


def test_the_record_forgets_a_session_once_it_has_expired(tmp_path):
    key = sessions.load_key(tmp_path / "data", None, without_it="no login")
    _, old = sessions.issue(key, "tok_1", 60, now=1000.0)
    _, new = sessions.issue(key, "tok_1", 3600, now=1000.0)
    sessions.end(key, old, now=1001.0)
    sessions.end(key, new, now=1100.0)  # `old` expired at 1060: its cookie is refused as expired anyway
    record = tmp_path / "data" / sessions.SECRETS_DIR / sessions.ENDED_FILE
    assert json.loads(record.read_text())["ended"] == {new.nonce: new.expires}


def test_an_unreadable_record_refuses_every_session(tmp_path):
    key = sessions.load_key(tmp_path / "data", None, without_it="no login")
    cookie, _ = sessions.issue(key, "tok_1", 3600)
    (tmp_path / "data" / sessions.SECRETS_DIR / sessions.ENDED_FILE).write_text("not json")
    with pytest.raises(sessions.SessionRefused, match="cannot be read"):
        sessions.read(key, cookie)


def test_logging_out_ends_the_event_stream_the_session_opened(tmp_path):
    key = sessions.load_key(tmp_path / "data", None, without_it="no login")
    with submit_context(tmp_path, session_secret=key, session_lifetime=3600) as ctx:
        ctx.bus = StreamBus()
        with served(submit_app(ctx)) as server:
            host = server.removeprefix("http://")
            with httpx.Client(base_url=server, timeout=WITNESS_TIMEOUT) as client:
                origin = {"Origin": f"http://{host}"}
                assert client.post("/login", data={"token": "tok-vision"}, headers=origin).status_code == 303
                csrf = re.search(r'<meta name="csrf-token" content="([^"]+)"', client.get("/jobs").text)
                with client.stream("GET", "/v1/events/stream") as stream:
                    lines = stream.iter_lines()
                    assert next(lines) == ": connected"
                    out = client.post("/logout", data={"csrf": csrf.group(1)}, headers=origin)
                    assert out.status_code == 303
                    assert ": access ended: this session was logged out: log in again" in rest_of(lines)
